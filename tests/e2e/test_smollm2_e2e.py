"""A real instruct model through the whole dataflow: a few GRPO steps of SmolLM2-135M-Instruct
(Llama with grouped-query attention and tied embeddings, its BPE tokenizer and ChatML
template) on a reasoning-gym task, every role its own process on the embedded bus
(examples/smollm2_chain_sum.yaml, shortened). The model is imported from its gguf once per
machine (~/.cache/astraflow/models), like the virtual environment.

Checked several ways: the run ends with every trajectory accounted for; the trajectories'
prompts are the chat template's rendering of their tasks and their version-0 logprobs are a
teacher-forced forward of the model; the weight deltas rebuild, bit for bit, what the trainer
ended with; the held-out evaluation lines name the task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from run_helpers import check_finished, run_astraflow

ROOT = Path(__file__).resolve().parents[2]
STEPS, GROUPS, SAMPLES = 3, 4, 4

# one worker runs the module (its fixture is the run; under xdist another worker would repeat it)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2")]


@pytest.fixture(scope="module")
def smollm2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from astraflow.models.importer import cached_shortcut

    cached_shortcut("smollm2-135m-instruct")  # imported once per machine, outside the run
    out = tmp_path_factory.mktemp("smollm2") / "run"
    sets = [f"trainer.max_steps={STEPS}", f"data.batch_size={GROUPS}",
            f"producer.n_samples={SAMPLES}", "rollout.engine.max_new_tokens=8",
            "producer.reasoning_gym.size=64", "launch.eval_problems=12",
            "launch.eval_samples=2", f"launch.eval_every={STEPS}", "launch.timeout_s=900",
            "trainer.checkpoint_every=3", "launch.restart=false"]
    rc, output = run_astraflow(
        ["run", str(ROOT / "examples" / "smollm2_chain_sum.yaml"), "--out", str(out),
         "--no-live", *[a for s in sets for a in ("--set", s)]], out, timeout=1500)
    check_finished(out, rc, output, steps=STEPS, per_step=GROUPS * SAMPLES)
    return out


def _records(out: Path, topic: str, kind: type) -> list:
    from astraflow.core.bus import connect
    from astraflow.core.bus.reader import read_all
    from astraflow.core.records import decode

    bus = connect(f"embedded://{out}/bus.db")
    try:
        return [decode(m.value, kind)
                for m in read_all(bus, f"af.smollm2_chain_sum.{topic}", idle_timeout=10)]
    finally:
        bus.close()


def test_evaluation_lines_name_the_task_before_and_after(smollm2_run: Path) -> None:
    rows = [json.loads(x) for x in (smollm2_run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_accuracy" in r]
    assert [e["step"] for e in evals][0] == 0 and evals[-1]["step"] == STEPS, evals
    assert {e["task"] for e in evals} == {"rg/chain_sum"}
    assert all(e["eval_k"] == 2.0 for e in evals)


def test_trajectories_are_the_templates_tokens_and_the_models_logprobs(
        smollm2_run: Path) -> None:
    import torch

    from astraflow.core.records import Task, Trajectory, unpack
    from astraflow.models.importer import cached_shortcut
    from astraflow.models.prompt import render_prompt
    from astraflow.models.tiny import load

    tasks = {t.id: t for t in _records(smollm2_run, "tasks", Task)}
    trajs = [t for t in _records(smollm2_run, "trajectories", Trajectory)
             if t.finish_reason != "error"]
    assert len(trajs) >= STEPS * GROUPS * SAMPLES
    model, tok = load(cached_shortcut("smollm2-135m-instruct"))
    first = [t for t in trajs if set(unpack(t.versions, "i4")[t.prompt_len:]) == {0}][:4]
    assert first, "no trajectory sampled wholly at version 0"
    for t in first:
        ids = unpack(t.token_ids, "i4").tolist()
        _, prompt = render_prompt(tok, tasks[t.task_id].prompt)
        assert ids[:t.prompt_len] == prompt  # ChatML, SmolLM2's default system turn included
        assert tok.decode(prompt).startswith("<|im_start|>system\n")
        mask = unpack(t.loss_mask, "u1")
        assert mask[:t.prompt_len].sum() == 0 and mask[t.prompt_len:].all()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(
            1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()
        got = unpack(t.logprobs, "f4")[t.prompt_len:]
        np.testing.assert_allclose(got, logp[t.prompt_len - 1:], atol=1e-4, rtol=0)


def test_the_weight_deltas_rebuild_the_trainers_weights_bit_for_bit(smollm2_run: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from astraflow.config import load_experiment
    from astraflow.consumers.rollout.engines.target import ModelTarget
    from astraflow.core.records import WeightManifest
    from astraflow.models.importer import cached_shortcut
    from astraflow.models.tiny import load
    from astraflow.run.resources import open_bus
    from astraflow.weights.config import build_syncer

    manifests = _records(smollm2_run, "weights.default", WeightManifest)
    assert {m.kind for m in manifests} >= {"full", "delta"}, [m.kind for m in manifests]
    cfg = load_experiment(smollm2_run / "config-rl.yaml")
    model, _ = load(cached_shortcut("smollm2-135m-instruct"))
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads == 3
    bus = open_bus(cfg, smollm2_run, create_topics=False)
    syncer = build_syncer(bus, cfg.weights, ModelTarget(model), run=cfg.run, policy="default",
                          worker="test", out=smollm2_run)
    try:
        version = None
        for _ in range(50):
            version = syncer.sync_once(timeout=1.0)
            if version == STEPS:
                break
        assert version == STEPS
    finally:
        syncer.close()
        bus.close()
    final = load_file(str(smollm2_run / "final" / "default" / "model.safetensors"))
    got = model.state_dict()
    for name, want in final.items():
        assert torch.equal(got[name], want.to(torch.bfloat16).to(got[name].dtype)), name
    assert got["lm_head.weight"].data_ptr() == got["model.embed_tokens.weight"].data_ptr()
