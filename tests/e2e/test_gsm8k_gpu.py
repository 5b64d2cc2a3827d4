"""examples/gsm8k_gpu.yaml on a GPU (marked ``gpu``: run where a CUDA device is lent): the
recipe as written — GSM8K-shaped data from `datasets` on disk, the answer regex, bf16 mixed
precision, the engine on CUDA — through `astraflow run` for a few steps. A device machine
reaches no hub, so the model is a tiny one built there (``tiny-ascii``) in place of
Qwen2.5-1.5B-Instruct, and the engine is ``hf`` on CUDA where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from run_helpers import run_astraflow

ROOT = Path(__file__).resolve().parents[2]

torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gsm8k_recipe_runs_on_a_gpu(tmp_path: Path) -> None:
    import datasets

    rows = [{"question": f"Tom has {i} apples and buys {j} more. How many now?",
             "answer": f"{i} + {j} = {i + j}\n#### {i + j}"} for i in range(12) for j in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:40]),
                          "test": datasets.Dataset.from_list(rows[40:])}
                         ).save_to_disk(str(tmp_path / "gsm8k"))
    engine = [] if importlib.util.find_spec("vllm") else ["rollout.engine.type=hf"]
    sets = [f"producer.hf_datasets.path={tmp_path / 'gsm8k'}",
            "models.default.build=tiny-ascii", "models.default.path={out}/models/tiny",
            "trainer.max_steps=3", "data.batch_size=4", "producer.n_samples=4",
            "rollout.engine.max_new_tokens=16", "launch.eval_problems=8",
            "launch.eval_every=3", "launch.timeout_s=600", "launch.restart=false",
            # the untrained tiny model scores 0 on every group, and dynamic sampling drops
            # every group whose rewards are all equal: the trainer would never get a batch
            # (seen on an H200: 120 of 120 groups dropped, no step in 600 s)
            "data.post_rollout=[assembler, staleness]", *engine]
    out = tmp_path / "run"
    rc, output = run_astraflow(["run", str(ROOT / "examples" / "gsm8k_gpu.yaml"), "--out",
                                str(out), "--no-live", *[a for s in sets for a in ("--set", s)]],
                               out, timeout=1200)
    assert rc == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 3 and summary["failed_roles"] == []
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
             if "eval_accuracy" in x]
    assert evals and {e["task"] for e in evals} == {"gsm8k"}
