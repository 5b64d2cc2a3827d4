"""The vllm engine (GPU only): reported as skipped where vLLM or CUDA is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def vllm_engine(arith_dir: Path):  # noqa: ANN201
    pytest.importorskip("vllm", reason="vLLM is not installed")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from astraflow.consumers.rollout.engines import build_engine

    return build_engine("vllm", model_path=arith_dir, dtype="float32",
                        gpu_memory_utilization=0.2, vllm_args={"enforce_eager": True})


def test_vllm_logprobs_match_teacher_forcing(vllm_engine, arith_dir: Path) -> None:
    import torch

    from astraflow.consumers.rollout.engines import GenRequest
    from astraflow.models.tiny import load

    model, tok = load(arith_dir)
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "40+2=")]
    results = vllm_engine.generate([GenRequest(p, max_new_tokens=4, temperature=0.8)
                                    for p in prompts])
    for p, r in zip(prompts, results, strict=True):
        assert r.token_ids and len(r.logprobs) == len(r.token_ids)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([p + r.token_ids])).logits[0]
        ref = [torch.log_softmax(logits[len(p) - 1 + j] / 0.8, -1)[t].item()
               for j, t in enumerate(r.token_ids)]
        assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 1e-2


def test_vllm_takes_new_weights_in_place(vllm_engine, arith_dir: Path, tmp_path: Path) -> None:
    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.core.bus import connect
    from astraflow.models.tiny import load
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore
    from astraflow.weights.syncer import Syncer

    bus = connect(f"embedded://{tmp_path}/bus.db")
    store = FileStore(tmp_path / "weights")
    trainer, _ = load(arith_dir)
    pub = Publisher(bus, run="v", policy="default", store=store)
    pub.publish(trainer.state_dict(), 1)
    pub.flush()
    follower = WeightFollower(Syncer(bus, run="v", policy="default", store=store,
                                     target=vllm_engine.weight_target()), engine=vllm_engine)
    assert follower.sync_now(timeout=10) == 1
    assert vllm_engine.version == 1
    from astraflow.consumers.rollout.engines import GenRequest

    (r,) = vllm_engine.generate([GenRequest([1, 4, 13, 5, 16], max_new_tokens=2)])
    assert r.versions == [1] * len(r.token_ids)
    follower.close()
    pub.close()
    bus.close()
