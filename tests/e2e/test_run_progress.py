"""`astraflow run` under a pipe (as `astraflow run ... | tee log` or a script runs it): one
plain progress line every launch.progress_every_s through the warm-up and RL, the TensorBoard
sink written by the real run; then the same directory: refused without --fresh; with
`--fresh --quiet` deleted first, no progress line, and exit code 3 when a role fails for good.
(~3 minutes on 2 busy cores: slow.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1].parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
SMALL = ["launch.warmup.steps=3", "launch.warmup.target_accuracy=null", "launch.evaluate=false",
         "trainer.max_steps=3", "launch.progress_every_s=1", "launch.timeout_s=120",
         "launch.stop_grace_s=10"]


def run(out: Path, *args: str, sets: list[str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "astraflow.cli.app", "run", str(QUICKSTART), "--out",
            str(out), *args, *[a for s in sets for a in ("--set", s)]]
    return subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=400)  # a hang guard only


@pytest.mark.slow
@pytest.mark.timeout(900)  # two runs: ~2 min alone, ~4 min on 2 busy cores
def test_progress_lines_under_a_pipe_then_fresh_and_quiet(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    name = f"progress{tmp_path.name[-6:]}".replace("_", "")
    r = run(out, sets=[*SMALL, f"run={name}", "metrics.sinks=[tensorboard]"])
    assert r.returncode == 0, r.stdout[-4000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("progress ")]
    warm = [x for x in lines if x.startswith("progress warm-up ")]
    rl = [x for x in lines if x.startswith("progress rl ")]
    assert warm and rl and lines.index(warm[-1]) < lines.index(rl[0]), lines
    assert re.fullmatch(r"progress warm-up \d+(m\d\ds)?s? step (\d+|-)/3 accuracy -", warm[-1])
    pattern = (r"progress rl \S+ step (\d+|-)/3 reward (\S+) accuracy - wait (\S+) "
               r"episodes/s \d+\.\d\d lag (\d+|-)")
    assert all(re.fullmatch(pattern, x) for x in rl), rl
    assert re.fullmatch(pattern, rl[-1]).group(1) == "3"  # the last line: the run's end
    assert "\x1b[" not in "".join(lines)  # plain text, no terminal codes
    # the real run's metrics reached TensorBoard, per role and policy
    acc = EventAccumulator(str(out / "tensorboard" / name))
    acc.Reload()
    # every trainer line of the run's metrics (metrics.jsonl: what the live view shows, one
    # line per report; a loaded host may fold several steps into one report) is in TensorBoard
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    reported = [int(r["step"]) for r in rows
                if r.get("policy") == "default" and "reward_mean" in r]
    steps = [e.step for e in acc.Scalars("trainer/default/reward_mean")]
    assert steps == reported and steps[-1] == 3, (steps, reported)
    assert "rollout/episodes_per_s" in acc.Tags()["scalars"]

    # the same directory again: refused unasked; --fresh deletes it; --quiet prints no line;
    # a trainer that cannot write its first checkpoint (no such directory under /proc) fails
    # for good with launch.max_restarts=0: exit 3
    r = run(out, sets=SMALL)
    assert r.returncode == 1 and "--fresh" in r.stdout and "--resume" in r.stdout, r.stdout
    (out / "marker").write_text("from the first run")
    r = run(out, "--fresh", "--quiet", "--no-check",
            sets=[*SMALL, f"run={name}b", "launch.warmup.steps=0", "launch.max_restarts=0",
                  "trainer.checkpoint_every=1",
                  "trainer.checkpoint_dir=/proc/astraflow-no-such-dir/{policy}"])
    assert r.returncode == 3, r.stdout[-4000:]
    assert not (out / "marker").exists()
    assert not [x for x in r.stdout.splitlines() if x.startswith("progress ")], r.stdout
    assert "role trainer-default died (exit 1) and is not restarted" in r.stdout
