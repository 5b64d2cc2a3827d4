"""Fault tolerance of the real CLI process: a trainer SIGKILLed between checkpoints and
restarted, then stopped with SIGTERM and restarted again, ends at bit-identical weights and
optimizer state to an uninterrupted run on the same batches — no batch lost, none trained
twice. Once as one process (ddp), once as 2 fsdp ranks in a gang (astraflow.core.gang, as
`astraflow run` starts them; the signals go to the whole process group)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from trainer_helpers import produce, random_batch

from astraflow.config import load_experiment
from astraflow.core.gang import gang_argv
from astraflow.core.records import WeightManifest, decode
from astraflow.run.resources import open_bus

FINAL = 8


def write_config(out: Path, model: Path, run: str, parallel: str = "ddp") -> Path:
    body = {"run": run, "bus": {"url": "embedded://{out}/bus.db"},
            "models": {"default": {"path": str(model)}},
            "trainer": {"parallel": parallel, "checkpoint_every": 3, "max_steps": FINAL, "threads": 1,
                        "deterministic": True, "session_timeout_s": 1.0,
                        "poll_timeout_s": 0.1, "optimizer": {"lr": 1e-2},
                        "micro_batch_tokens": 40}}
    path = out / "experiment.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def start(config: Path, out: Path, ranks: int = 1) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "astraflow.cli.train", str(config), "--policy", "default",
            "--out", str(out)]
    return subprocess.Popen(argv if ranks == 1 else gang_argv(ranks, argv),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def signal_all(proc: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to the trainer's process group: the one process, or the gang and its ranks."""
    os.killpg(proc.pid, sig)


def log_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "trainer-default.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def wait_for_step(proc: subprocess.Popen[bytes], out: Path, step: int, starts: int,
                  timeout: float = 120.0) -> None:
    """Until the ``starts``-th start of the trainer has logged ``step``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = log_rows(out)
        since = [i for i, r in enumerate(rows) if r.get("event") == "start"]
        if len(since) >= starts and any(r.get("step") == step
                                        for r in rows[since[starts - 1]:]):
            return
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early: {proc.communicate()[0].decode()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"step {step} not logged within {timeout} s")


def finish(proc: subprocess.Popen[bytes], timeout: float = 120.0) -> str:
    output = proc.communicate(timeout=timeout)[0].decode()
    assert proc.returncode == 0, output
    return output


def published(bus: Any, run: str) -> dict[int, set[tuple[str, ...]]]:
    """Per published version, the distinct sets of tensor digests its manifests carry."""
    topic = f"af.{run}.weights.default"
    end = sum(bus.describe_topic(topic).end_offsets.values())
    consumer = bus.consumer(f"reader-{run}", [topic])
    manifests: list[WeightManifest] = []
    for _ in range(100):
        if len(manifests) >= end:
            break
        manifests += [decode(m.value, WeightManifest) for m in consumer.consume(100, 0.1)]
    consumer.close()
    out: dict[int, set[tuple[str, ...]]] = {}
    for m in manifests:
        out.setdefault(m.version, set()).add(tuple(t.digest for t in m.tensors))
    return out


def tensors(out: Path, version: int, model_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = out / "checkpoints" / "trainer-default" / f"step-{version:010d}"
    if (ckpt / "model.safetensors").exists():
        return {**{f"model.{k}": v for k, v in load_file(ckpt / "model.safetensors").items()},
                **{f"opt.{k}": v
                   for k, v in load_file(ckpt / "optimizer.safetensors").items()}}
    # a sharded checkpoint: its whole tensors, read into one unsharded model
    from astraflow.consumers.trainer.sharded_checkpoint import load_shards
    from astraflow.models.tiny import load

    model, _ = load(model_dir)
    opt = torch.optim.AdamW(model.parameters())
    load_shards(model, opt, ckpt / "dcp")
    sd = opt.state_dict()["state"]
    return {**{f"model.{k}": v for k, v in model.state_dict().items()},
            **{f"opt.{i}.{k}": v for i, st in sd.items() for k, v in st.items()}}


@pytest.mark.slow
@pytest.mark.parametrize("ranks,parallel", [(1, "ddp"), (2, "fsdp")])
def test_sigkill_and_sigterm_resume_bit_identical(tmp_path: Path, tiny_dir: Path, ranks: int,
                                                  parallel: str) -> None:
    batches = [random_batch(s, groups=4, group_size=4) for s in range(FINAL)]
    runs = {}
    for name in ("straight", "killed"):
        out = tmp_path / name
        out.mkdir()
        config = write_config(out, tiny_dir, run=name, parallel=parallel)
        cfg = load_experiment(config)
        runs[name] = (out, config, open_bus(cfg, out), cfg)

    out, config, bus, cfg = runs["straight"]
    produce(bus, cfg.run, batches)
    finish(start(config, out, ranks))

    out, config, bus, cfg = runs["killed"]
    group, topic = f"af.{cfg.run}.trainer.default", f"af.{cfg.run}.batches.default"
    produce(bus, cfg.run, batches[:5])
    proc = start(config, out, ranks)
    wait_for_step(proc, out, 5, starts=1)  # steps 4, 5 after the checkpoint at 3
    signal_all(proc, signal.SIGKILL)
    proc.wait()
    ckpts = out / "checkpoints" / "trainer-default"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-")) == [
        "step-0000000003"]
    assert bus.committed(group, topic) == {0: 3}

    produce(bus, cfg.run, batches[5:7])
    proc = start(config, out, ranks)
    wait_for_step(proc, out, 7, starts=2)
    signal_all(proc, signal.SIGTERM)  # finish the step, checkpoint, commit, exit 0
    finish(proc)
    assert bus.committed(group, topic) == {0: 7}

    produce(bus, cfg.run, batches[7:])
    assert "version=8 steps=1" in finish(start(config, out, ranks))

    rows = log_rows(out)
    starts = [i for i, r in enumerate(rows) if r.get("event") == "start"]
    assert [rows[i]["version"] for i in starts] == [0, 3, 7]
    trained = [[r["batch_seq"] for r in rows[a:b] if "step" in r]
               for a, b in zip(starts, starts[1:] + [len(rows)], strict=True)]
    assert trained == [[0, 1, 2, 3, 4], [3, 4, 5, 6], [7]]

    # versions 4 and 5 were published twice (before the kill and after the resume): with
    # the same bits, and the same as the uninterrupted run's. The publisher coalesces a
    # version into the next when the trainer outpaces it (a loaded CI run skipped version 3
    # of the uninterrupted run), so each run publishes its last version and some of the
    # others, and every version both runs published has the same bits in both
    digests = {name: published(bus, cfg.run) for name, (_, _, bus, cfg) in runs.items()}
    for name, seen in digests.items():
        assert FINAL in seen and set(seen) <= set(range(1, FINAL + 1)), (name, sorted(seen))
    for v, seen in digests["killed"].items():
        assert len(seen) == 1, v  # published twice: the same bits
        assert v not in digests["straight"] or seen == digests["straight"][v], v

    a, b = tensors(runs["straight"][0], FINAL, tiny_dir), tensors(out, FINAL, tiny_dir)
    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert differing == []
    for _, _, bus, _ in runs.values():
        bus.close()
