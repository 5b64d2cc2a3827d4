"""The agent of examples/agents/adder.py, written only against the OpenAI SDK, trains through
`astraflow run examples/gateway_agent.yaml`: every episode runs the agent against the rollout
worker's own gateway (the ``openai_agent`` workflow), and its session becomes the episode's
trajectory for the rest of the dataflow."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from run_helpers import check_finished, replayed, run_astraflow, train_rewards

from astraflow.core.bus import connect
from astraflow.core.bus.reader import read_all
from astraflow.core.records import Trajectory, decode, unpack
from astraflow.core.topics import topic_name
from astraflow.models.tiny import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gateway_agent.yaml"
# A short run from the quickstart's warm model: 20 steps of 16 groups x 8 episodes on the
# problems with both operands in 0..19 (2,560 episodes: both kinds, answered at once and
# retried, happen). That the agent learns through this path (150 steps: +0.122 to +0.138 over
# three runs from the weaker warm model) is bench/learning.py's `gateway-agent` scenario: too
# long for CI on two cores (~130 s alone, ~350 s beside another test).
STEPS, GROUPS, SAMPLES = 20, 16, 8
BUDGET = [f"trainer.max_steps={STEPS}", f"data.batch_size={GROUPS}",
          "trainer.optimizer.warmup_steps=5", "producer.arithmetic.max_value=19",
          "launch.evaluate=false", "launch.timeout_s=400"]


def run_example(out: Path, warm: Path) -> tuple[int, str, float]:
    sets = [*BUDGET, f"models.default.path={warm}", "models.default.build=none",
            "launch.warmup.steps=0"]
    start = time.monotonic()
    rc, output = run_astraflow(["run", str(EXAMPLE), "--out", str(out), "--no-live",
                                *[a for s in sets for a in ("--set", s)]], out, timeout=800)
    return rc, output, time.monotonic() - start


def check_trajectory(t: Trajectory, tok: object) -> None:
    """One episode of the agent, laid out as its session recorded it: the prompt, the model's
    answer, and when the agent's check failed, the question again and the second answer; the
    loss mask exactly over the model's tokens; the reward, exact match of the final answer."""
    ids = unpack(t.token_ids, "<i4").tolist()
    mask = unpack(t.loss_mask, "u1").tolist()
    logprobs = unpack(t.logprobs, "<f4").tolist()
    versions = unpack(t.versions, "<i4").tolist()
    assert len(ids) == len(mask) == len(logprobs) == len(versions), t.id
    roles = [s.role for s in t.spans]
    assert roles in (["prompt", "assistant"], ["prompt", "assistant", "user", "assistant"]), t.id
    assert t.spans[0].start == 0 and t.spans[-1].end == len(ids) and t.prompt_len == \
        t.spans[0].end
    assert all(a.end == b.start for a, b in zip(t.spans, t.spans[1:], strict=False)), t.spans
    for s in t.spans:
        model = s.role == "assistant"
        for i in range(s.start, s.end):
            assert mask[i] == model, (t.id, i)
            assert (versions[i] >= 0 and logprobs[i] <= 0) if model else \
                (versions[i] == -1 and logprobs[i] == 0.0), (t.id, i)
    text = [tok.decode(ids[s.start:s.end], skip_special_tokens=True)  # type: ignore[attr-defined]
            for s in t.spans]
    a, b = re.fullmatch(r"arith/(\d+)\+(\d+)", t.task_id).groups()  # type: ignore[union-attr]
    question, right = f"{a}+{b}=", str(int(a) + int(b))
    assert text[0] == question, text
    if len(text) == 4:  # the check failed: the question again (retry: "{question}")
        assert text[1].strip() != right and text[2] == question, text
    assert t.reward == float(text[-1].strip() == right), (text, t.reward)
    assert t.worker_id.startswith("rollout") and t.group_size == SAMPLES


@pytest.mark.slow
@pytest.mark.timeout(900)  # the session's warm-up (~110 s, once) and the run (~40 s)
def test_the_agent_trains_through_astraflow_run(tmp_path: Path, quickstart_warm: Path) -> None:
    """The run takes its steps with no trajectory lost or trained twice, every trajectory is
    its episode's session as the agent played it, the warm model earns reward from the first
    steps, and the run retrains bit for bit from its log. (Learning: bench/learning.py.)"""
    out = tmp_path / "run"
    rc, output, seconds = run_example(out, quickstart_warm)
    acc = check_finished(out, rc, output, steps=STEPS, per_step=GROUPS * SAMPLES)["accounting"]
    rewards = train_rewards(out)
    assert len(rewards) == STEPS
    # the warm model answers some sums of 0..19 right (a broken reward or layout gives 0)
    assert all(0.0 <= r <= 1.0 for r in rewards) and sum(rewards) / STEPS > 0.05, \
        ([round(r, 3) for r in rewards], f"{seconds:.0f} s")

    bus = connect(f"embedded://{out}/bus.db")
    try:
        # the workers' gateways keep their sessions in memory: nothing on the gateway topic
        assert list(read_all(bus, topic_name("gateway-agent", "gateway"))) == []
        trajectories = [decode(m.value, Trajectory) for m in
                        read_all(bus, topic_name("gateway-agent", "trajectories"))]
    finally:
        bus.close()
    assert len(trajectories) == acc["produced"]
    assert all(t.error is None for t in trajectories)
    tok = load_tokenizer(quickstart_warm)
    for t in trajectories:
        check_trajectory(t, tok)  # type: ignore[arg-type]
    retried = sum(len(t.spans) == 4 for t in trajectories)
    assert 0 < retried < len(trajectories)  # both kinds of episode happened
    # a multi-turn agent run, retrained from its log: every version bit for bit
    replayed(out, "default")
