"""launch.warmup.target_accuracy: the SFT warm-up stops at the first held-out check inside a
band, so RL starts from the same accuracy on every machine. The band logic on lists of
checks; the config rules; and the phase itself with a real `astraflow train` process on the
tiny model (landing, and missing the band)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from astraflow.config import ExperimentConfig
from astraflow.run.launch import warmup_config
from astraflow.run.warmup_checks import BandWatch, Check, distance


def watch(band: tuple[float, float], *accs: float, every: int = 10) -> BandWatch:
    w = BandWatch(band)
    for i, a in enumerate(accs):
        w.add(Check(i * every, a))
    return w


def test_the_first_check_inside_the_band_is_where_rl_starts() -> None:
    w = BandWatch((0.2, 0.3))
    assert not w.add(Check(0, 0.0))
    assert not w.add(Check(10, 0.19))
    assert w.add(Check(20, 0.2))  # the edge is inside
    assert not w.add(Check(30, 0.25))  # later checks do not move it
    assert w.landed == Check(20, 0.2)
    assert w.outcome("error") == ("in_band", Check(20, 0.2))
    assert w.outcome("closest") == ("in_band", Check(20, 0.2))
    assert distance(0.1, (0.2, 0.3)) == pytest.approx(0.1)
    assert distance(0.35, (0.2, 0.3)) == pytest.approx(0.05)
    assert distance(0.3, (0.2, 0.3)) == 0.0


def test_a_miss_fails_or_takes_the_nearest_check() -> None:
    w = watch((0.5, 0.6), 0.0, 0.3, 0.45, 0.4, 0.45)
    assert w.landed is None
    assert w.outcome("error") == ("missed", None)
    assert w.outcome("closest") == ("closest", Check(20, 0.45))  # the earliest of equals
    assert "raise launch.warmup.steps" in w.describe_miss()


def test_a_jump_over_the_band_is_named_with_the_knob_to_turn() -> None:
    w = watch((0.2, 0.3), 0.1, 0.15, 0.42, 0.5)
    assert w.landed is None
    assert [(a.step, b.step) for a, b in w.jumps] == [(10, 20)]
    assert w.outcome("closest") == ("closest", Check(10, 0.15))  # 0.05 below beats 0.12 above
    msg = w.describe_miss()
    assert "jumped over the band between step 10 (0.150) and step 20 (0.420)" in msg
    assert "check_every" in msg
    # a fall back into the band after a jump still lands
    assert watch((0.2, 0.3), 0.1, 0.4, 0.25).landed == Check(20, 0.25)


def test_each_checkpoint_is_pinned_and_a_pruned_one_is_counted(tmp_path: Path) -> None:
    from astraflow.run.warmup_checks import CheckpointWatch

    root, keep = tmp_path / "ck", tmp_path / "pins"

    def checkpoint(step: int) -> None:
        d = root / f"step-{step:010d}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(str(step).encode())

    w = CheckpointWatch(root, keep, every=5)
    assert w.new() == []  # the trainer has not started
    checkpoint(5)
    checkpoint(10)
    assert [s for s, _ in w.new()] == [5, 10] and w.new() == []
    shutil.rmtree(root / f"step-{5:010d}")  # the trainer prunes: the pin stays readable
    assert (keep / f"step-{5:010d}" / "model.safetensors").read_bytes() == b"5"
    checkpoint(25)  # 15 and 20 were written and pruned while nobody looked
    checkpoint(27)  # where the trainer stopped (SIGTERM or the cap)
    assert [s for s, _ in w.new()] == [25, 27] and w.missed == [15, 20]


def test_pins_not_yet_measured_survive_pruning(tmp_path: Path) -> None:
    # a busy host: one scan pins several checkpoints; measuring the first must not prune the
    # others before they are measured (it did: FileNotFoundError on the second)
    from astraflow.run.warmup import PolicyWarmup, _prune_pins
    from astraflow.run.warmup_checks import BandWatch, CheckpointWatch

    root = tmp_path / "ck"
    for step in (5, 10, 15):
        (root / f"step-{step:010d}").mkdir(parents=True)
        (root / f"step-{step:010d}" / "model.safetensors").write_bytes(b"w")
    r = PolicyWarmup("p", BandWatch((0.5, 0.6)), probe=None,  # type: ignore[arg-type]
                     checkpoints=CheckpointWatch(root, tmp_path / "pins", every=5))
    pinned = r.checkpoints.new()
    for i, (step, pin) in enumerate(pinned):
        assert (pin / "model.safetensors").exists(), step
        r.watch.add(Check(step, 0.1 * (i + 1)))
        _prune_pins(r)
    assert [p.name for p in (tmp_path / "pins").iterdir()] == [f"step-{15:010d}"]


def test_each_policy_may_have_its_own_band_lr_and_steps() -> None:
    c = ExperimentConfig.model_validate({
        "policies": ["solver", "verifier"],
        "trainers": {"verifier": {"optimizer": {"lr": 1e-5}}},  # RL only
        "launch": {"warmup": {"steps": 300, "lr": 2e-3, "target_accuracy": [0.2, 0.3],
                              "policies": {"verifier": {"target_accuracy": [0.6, 0.7],
                                                        "lr": 1e-3, "steps": 500}}}}})
    w = c.launch.warmup
    assert (w.band("solver"), w.band("verifier")) == ((0.2, 0.3), (0.6, 0.7))
    warm = warmup_config(c)
    assert warm.trainer_for("solver").optimizer.lr == 2e-3
    assert warm.trainer_for("verifier").optimizer.lr == 1e-3  # not the RL override
    assert warm.trainer_for("verifier").max_steps == 500
    assert warm.trainer_for("solver").max_steps == 300
    with pytest.raises(Exception, match=r"launch.warmup.policies.judge\n.*unknown policy"):
        ExperimentConfig.model_validate({"policies": ["solver"], "launch": {"warmup": {
            "policies": {"judge": {"lr": 1e-3}}}}})


def cfg(**warmup: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"launch": {"warmup": warmup}})


def test_the_band_is_validated() -> None:
    c = cfg(steps=100, target_accuracy=[0.2, 0.3])
    assert c.launch.warmup.target_accuracy == (0.2, 0.3)
    for bad in ([0.3, 0.2], [0.2, 0.2], [-0.1, 0.3], [0.2, 1.5]):
        with pytest.raises(Exception, match="0 <= low < high <= 1"):
            cfg(steps=100, target_accuracy=bad)
    # `--set launch.warmup.steps=0` turns a banded warm-up off (RL from a given model)
    assert cfg(steps=0, target_accuracy=[0.2, 0.3]).launch.warmup.steps == 0
    with pytest.raises(Exception, match="on_miss"):
        cfg(steps=100, target_accuracy=[0.2, 0.3], on_miss="ignore")


def test_the_warm_up_trainer_checkpoints_at_every_check() -> None:
    t = warmup_config(cfg(steps=300, target_accuracy=[0.2, 0.3], check_every=5)).trainer
    assert (t.mode, t.max_steps, t.checkpoint_every) == ("sft", 300, 5)
    assert t.keep_checkpoints >= 4  # time for `astraflow run` to pin each before pruning
    t = warmup_config(cfg(steps=300)).trainer  # no band: one checkpoint, at the end
    assert (t.max_steps, t.checkpoint_every) == (300, 300)


# ------------------------------------------------------------------ the phase, for real

def experiment(tmp_path: Path, **warmup: object) -> ExperimentConfig:
    """The quickstart's task and tiny model; only the warm-up matters here."""
    return ExperimentConfig.model_validate({
        "run": "wb", "bus": {"url": f"embedded://{tmp_path}/bus.db"},
        "models": {"default": {"build": "tiny-arith", "seed": 0}},
        "producer": {"source": "arithmetic", "arithmetic": {
            "ops": ["+"], "min_value": 0, "max_value": 99, "test_fraction": 0.05, "seed": 0}},
        "rollout": {"engine": {"type": "hf", "max_new_tokens": 4}, "reward": {"name":
                                                                              "exact_match"}},
        "trainer": {"threads": 1, "metrics_interval_s": 0.5},
        "launch": {"eval_problems": 500, "stop_grace_s": 30,
                   "warmup": {"batch_size": 256, "lr": 2e-3, **warmup}}})


def run_phase(config: ExperimentConfig, out: Path) -> tuple[ExperimentConfig | None, str]:
    from rich.console import Console

    from astraflow.run.resources import create_run_topics, model_dir, open_bus
    from astraflow.run.supervisor import Supervisor
    from astraflow.run.warmup import run_warmup

    out.mkdir(parents=True)
    model_dir(config, "default", out)
    bus = open_bus(config, out, create_topics=False)
    create_run_topics(config, bus)
    buf = io.StringIO()
    console = Console(file=buf, width=10_000)
    sup = Supervisor(out, max_restarts=0, grace_s=30)
    try:
        rl = run_warmup(config, out, bus, sup, console)
    finally:
        sup.stop()
        bus.close()
    return rl, buf.getvalue()


def accuracy_of(config: ExperimentConfig, model: Path) -> float:
    from astraflow.consumers.evaluator import greedy_accuracy, held_out
    from astraflow.consumers.rollout.rewards import build_reward
    from astraflow.models.tiny import load

    m, tok = load(model)
    m.eval()
    reward = build_reward(config.rollout.reward)
    return greedy_accuracy(m, tok, held_out(config.producer, 500),
                           lambda t, r: float(reward(t, r)), max_new_tokens=4)


@pytest.mark.slow
def test_the_warm_up_stops_in_the_band_and_rl_starts_from_that_check(tmp_path: Path) -> None:
    from astraflow.run.warmup import reuse

    out = tmp_path / "run"
    # the built model answers ~nothing; 1% comes within a few dozen SFT steps on any machine
    config = experiment(tmp_path, steps=300, target_accuracy=[0.01, 1.0], check_every=10)
    rl, text = run_phase(config, out)
    assert rl is not None, text
    result = json.loads((out / "warmup.json").read_text())
    r = result["policies"]["default"]
    assert r["outcome"] == "in_band" and result["band"] == [0.01, 1.0], r
    checks = r["checks"]
    assert checks[0][0] == 0 and [s for s, _ in checks] == list(range(0, 10 * len(checks), 10))
    assert all(a < 0.01 for _, a in checks[:-1]) and checks[-1][1] >= 0.01, checks
    assert [r["step"], r["accuracy"]] == checks[-1] and 0 < r["step"] < 300
    assert r["stopped_at"] < 300, r  # stopped at the landing, not run to the cap
    # RL starts from exactly the checked weights: the same accuracy measured afresh
    model = Path(rl.models["default"].path)
    assert model == out / "models" / "default-warm"
    assert accuracy_of(config, model) == r["accuracy"]
    assert f"held-out accuracy {r['accuracy']:.3f} at step {r['step']}" in text
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [[x["warmup_step"], x["warmup_accuracy"]] for x in rows] == checks
    assert all(x["phase"] == "warmup" and x["step"] == 0 and x["elapsed"] <= 0 for x in rows)
    assert not (out / "warmup").exists()  # the pinned weights are cleaned up
    again = reuse(config, out)  # a continued run starts RL from the same model
    assert again is not None and again.models["default"].path == str(model)


@pytest.mark.slow
def test_missing_the_band_by_the_cap_fails_the_run(tmp_path: Path) -> None:
    from astraflow.run.warmup import reuse

    out = tmp_path / "run"
    config = experiment(tmp_path, steps=20, target_accuracy=[0.97, 1.0], check_every=10)
    rl, text = run_phase(config, out)
    assert rl is None
    r = json.loads((out / "warmup.json").read_text())["policies"]["default"]
    assert r["outcome"] == "missed" and r["step"] is None and r["stopped_at"] is None
    assert [s for s, _ in r["checks"]] == [0, 10, 20]  # ran to the cap, checked every 10
    assert "missed launch.warmup.target_accuracy" in text and "RL does not start" in text
    assert reuse(config, out) is None
