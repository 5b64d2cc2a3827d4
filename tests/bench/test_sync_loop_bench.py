"""bench/sync_loop.py, the synchronous baseline of bench/quickstart.py: it samples with the
model in the rollout engine's dtype and autocast (a bf16 engine's pipeline is compared with a
loop that also samples in bf16), and that copy follows the trainer's weights after every
step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import sync_loop

ROOT = Path(__file__).resolve().parents[2]


def test_a_float32_engine_samples_from_the_trainers_model_itself() -> None:
    from astraflow.models.tiny import build_model, build_tokenizer

    model = build_model(build_tokenizer("arith"), hidden=32, layers=1, heads=2,
                        intermediate=64)
    assert sync_loop.serving_copy(model, "float32") is model
    assert sync_loop.serving_copy(model, "auto") is model


def test_a_bf16_engine_samples_from_a_bf16_copy_refreshed_after_every_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from astraflow.config import load_experiment

    config = load_experiment(ROOT / "examples" / "quickstart.yaml", [
        "launch.warmup.steps=0", "rollout.engine.dtype=bfloat16",
        "rollout.engine.mixed_precision=bf16", "data.batch_size=2",
        "producer.n_samples=4", "launch.eval_problems=8", "trainer.optimizer.lr=0.05",
        "trainer.optimizer.warmup_steps=0"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    seen: dict[str, object] = {}
    serving_copy = sync_loop.serving_copy

    def spy(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
        seen.update(model=model, copy=serving_copy(model, dtype),
                    start={k: v.clone() for k, v in model.state_dict().items()})
        return seen["copy"]

    monkeypatch.setattr(sync_loop, "serving_copy", spy)
    real_step = sync_loop.rl_step

    def step_that_moves(state, batch, version):  # a random model's rewards are all 0: no
        out = real_step(state, batch, version)  # gradient, so the test moves the weights
        with torch.no_grad():
            for param in state.model.parameters():
                param.add_(0.01 * (version + 1))
        return out

    monkeypatch.setattr(sync_loop, "rl_step", step_that_moves)
    sample_groups = sync_loop.sample_groups
    autocast: list[bool] = []

    def sampled(*args, **kwargs):  # the engine's autocast, the loop's sampling too
        autocast.append(kwargs["autocast"])
        return sample_groups(*args, **kwargs)

    monkeypatch.setattr(sync_loop, "sample_groups", sampled)
    sync_loop.run_sync(path, seconds=1e9, max_steps=2, every=1, out=tmp_path / "run",
                       log=lambda _: None)
    model, copy, start = seen["model"], seen["copy"], seen["start"]
    assert autocast == [True, True]
    assert copy is not model
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    # the steps changed the weights, and the copy holds them (rounded to bf16), not its own
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())
    for (name, c), (_, m) in zip(copy.named_parameters(), model.named_parameters(),
                                 strict=True):
        assert torch.equal(c, m.detach().to(torch.bfloat16)), name
