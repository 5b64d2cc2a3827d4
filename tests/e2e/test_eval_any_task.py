"""Evaluation for any task: a JSONL task, a reasoning-gym task and the arithmetic task each run
through `astraflow run` with the evaluator on, which measures the source's held-out split
with the configured reward and extraction, greedy and sampled (pass@k), and names the task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import run_astraflow

from astraflow.config import load_experiment
from astraflow.consumers.evaluator import completions, held_out, sampled_accuracy, vote
from astraflow.models.tiny import build_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def test_held_out_problems_carry_the_producers_system_prompt(tmp_path: Path) -> None:
    cfg = load_experiment(None, [
        "producer.source=reasoning_gym", "producer.reasoning_gym.dataset=chain_sum",
        "producer.reasoning_gym.test_size=5", "producer.system_prompt=Be brief."])
    specs = held_out(cfg.producer, 3, tmp_path)
    assert len(specs) == 3
    assert all(s.prompt[0].role == "system" and s.prompt[0].content == "Be brief."
               and s.prompt[1].role == "user" for s in specs)
    assert all(s.reference["rg_dataset"] == "chain_sum" for s in specs)


def test_sampled_completions_are_seeded_and_pass_at_k_bounds_the_sampled_accuracy() -> None:
    import torch

    from astraflow.core.records import ChatMessage
    from astraflow.producers.sources import TaskSpec

    tok = build_tokenizer("arith")
    model = build_model(tok, seed=0).eval()
    specs = [TaskSpec(id=str(i), prompt=[ChatMessage(role="user", content=f"{i}+{i}=")],
                      reference={"answer": str(2 * i)}) for i in range(6)]
    before = torch.random.get_rng_state()
    a = completions(model, tok, specs, max_new_tokens=3, samples=4, temperature=1.0, seed=7)
    b = completions(model, tok, specs, max_new_tokens=3, samples=4, temperature=1.0, seed=7)
    assert a == b and len(a) == 6 and all(len(row) == 4 for row in a)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's RNG untouched
    c = completions(model, tok, specs, max_new_tokens=3, samples=4, temperature=1.0, seed=8)
    assert c != a
    with pytest.raises(ValueError, match="1 when greedy"):
        completions(model, tok, specs, max_new_tokens=3, samples=2, temperature=0.0)

    def first_char_is_even(text: str, reference: dict) -> float:  # some right, some wrong
        return float(bool(text) and text[0] in "02468")

    s = sampled_accuracy(model, tok, specs, first_char_is_even, k=4, temperature=1.0,
                         max_new_tokens=3, seed=7)
    right = [[first_char_is_even(t, {}) for t in row] for row in a]
    assert s.accuracy == pytest.approx(sum(map(sum, right)) / 24)
    assert s.pass_at_k == pytest.approx(sum(any(r) for r in right) / 6)
    assert s.pass_at_k >= s.accuracy
    assert s.majority is None  # no answer key: no vote
    first = sampled_accuracy(model, tok, specs, first_char_is_even, k=4, temperature=1.0,
                             max_new_tokens=3, seed=7, key=lambda t: t[:1])
    # voting on the first character: right exactly where the most frequent one is even
    voted = [vote(row, lambda t: t[:1]) for row in a]
    assert first.majority == pytest.approx(
        sum(first_char_is_even(t, {}) for t in voted) / 6)
    assert first.accuracy == s.accuracy


def test_a_majority_vote_counts_answers_and_gives_a_tie_to_the_first() -> None:
    from astraflow.consumers.rollout.rewards.extract import last_number

    assert vote(["it is 4", "5", "so 4."], last_number) == "it is 4"
    assert vote(["7", "then 9", "9!"], last_number) == "then 9"
    assert vote(["3", "8"], last_number) == "3"  # a tie: the first given
    assert vote(["no idea", "8", "none"], last_number) == "8"  # no answer: no vote
    assert vote(["no idea", "none"], last_number) == "no idea"  # no answer anywhere


def _eval_lines(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_accuracy" in r]


SHORT = ["trainer.max_steps=4", "launch.eval_problems=16", "launch.eval_every=2",
         "launch.timeout_s=240", "data.batch_size=8", "producer.n_samples=4",
         "rollout.engine.max_new_tokens=4", "launch.warmup.steps=0", "launch.eval_samples=2",
         "launch.restart=false"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["arithmetic", "jsonl", "reasoning_gym"])
def test_every_task_source_runs_with_evaluation_on(tmp_path: Path, task: str) -> None:
    sets = list(SHORT)
    if task == "jsonl":
        data = tmp_path / "sums.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)})
                                + "\n" for a in range(10) for b in range(10)))
        sets += ["producer.source=jsonl", f"producer.path=[{data}]",
                 "producer.test_fraction=0.2", "rollout.reward.extract=last_number",
                 "rollout.reward.name=numeric_match"]
        name = "sums"
    elif task == "reasoning_gym":
        # a character-level model over printable ASCII reads reasoning-gym's English prompts
        sets += ["producer.source=reasoning_gym", "producer.reasoning_gym.dataset=chain_sum",
                 "producer.reasoning_gym.size=64", "producer.reasoning_gym.test_size=16",
                 "rollout.reward.name=reasoning_gym", "rollout.reward.extract=last_number",
                 "models.default.build=tiny-ascii", "models.default.path={out}/models/ascii"]
        name = "rg/chain_sum"
    else:
        name = "arith"
    out = tmp_path / "run"
    rc, output = run_astraflow(["run", str(ROOT / "examples" / "quickstart.yaml"), "--out",
                                str(out), "--no-live", *[a for s in sets for a in ("--set", s)]],
                               out, timeout=600)
    assert rc == 0, output[-4000:]
    evals = _eval_lines(out)
    assert evals, output[-4000:]
    assert {e["task"] for e in evals} == {name}
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 4, evals
    for e in evals:
        assert 0.0 <= e["eval_accuracy"] <= 1.0
        assert e["eval_k"] == 2.0 and e["eval_pass_at_k"] >= e["eval_sampled_accuracy"]
        assert e["eval_pass_at_k"] >= e["eval_majority_accuracy"]


def test_configs_that_would_train_on_the_held_out_split_or_sample_greedily_are_refused() -> None:
    from astraflow.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"producer\.arithmetic\.split.*held-out problems"):
        load_experiment(None, ["producer.arithmetic.split=test"])
    load_experiment(None, ["producer.arithmetic.split=test", "launch.evaluate=false"])
    with pytest.raises(ConfigError, match=r"launch\.eval_samples.*temperature"):
        load_experiment(None, ["launch.eval_samples=4", "rollout.engine.temperature=0"])
