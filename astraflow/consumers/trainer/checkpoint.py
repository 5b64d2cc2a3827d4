"""Atomic trainer checkpoints: weights, optimizer, RNG, version and consumed offsets.

A checkpoint is a directory ``step-<version>``: safetensors for the tensors (or, under fsdp, a
``dcp/`` directory of every rank's shards: :mod:`.sharded_checkpoint`) and ``meta.json`` for
the rest, with the sha256 of every file; no pickle. It is written to a temporary directory,
fsynced and renamed, so a reader sees a whole checkpoint or none; :meth:`CheckpointDir.load`
takes the newest one whose digests match (layout: docs/trainer.md#checkpoints-and-resume).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from astraflow.core.errors import AstraflowError

log = logging.getLogger("astraflow.trainer.checkpoint")

FORMAT = 1  # single-file safetensors
FORMAT_DCP = 2  # torch.distributed.checkpoint shards (fsdp)
_STEP = re.compile(r"^step-(\d{10})$")


class CheckpointError(AstraflowError):
    """A checkpoint could not be written or read, or belongs to another run or policy."""


@dataclass
class CheckpointMeta:
    """What a checkpoint holds besides tensors (written to its ``meta.json``)."""

    version: int
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # topic -> part -> next
    recent: list[str] = field(default_factory=list)  # ids of the newest batches trained
    counters: dict[str, float] = field(default_factory=dict)


def _comm_device() -> torch.device:
    """Where small collective tensors live: the GPU under NCCL, else the CPU."""
    import torch.distributed as dist

    if torch.cuda.is_available() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _own(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous copies (tied weights share storage, which safetensors refuses)."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}


def _is_peft(model: torch.nn.Module) -> bool:
    return getattr(model, "peft_config", None) is not None


def _model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of the model: every tensor, or with LoRA (a peft model) the
    trainable ones only, the frozen base being the model directory's."""
    if _is_peft(model):
        return {n: p for n, p in model.named_parameters() if p.requires_grad}
    return dict(model.state_dict())


def _optimizer_parts(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor],
                                                                 dict[str, Any]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{pid}.{key}"] = value
            else:
                scalars.setdefault(str(pid), {})[key] = value
    return _own(tensors), {"param_groups": sd["param_groups"], "scalars": scalars}


def _load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                    meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for pid, values in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(values)
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v)
               for k, v in g.items()} for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _rng_parts() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    py = random.getstate()
    numpy_state: Any = np.random.get_state()  # (typed a union with a dict's str keys)
    kind, keys, pos, gauss, cached = numpy_state
    return tensors, {"python": [py[0], list(py[1]), py[2]],
                     "numpy": [kind, keys.tolist(), int(pos), int(gauss), float(cached)]}


def _load_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(t for t in tensors if t.startswith("cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[:torch.cuda.device_count()])
    py = meta["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, gauss, cached = meta["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, gauss, cached))


class CheckpointDir:
    """The checkpoints of one trainer (run, policy) under ``root``."""

    def __init__(self, root: str | Path, *, run: str, policy: str, keep: int = 2) -> None:
        self.root = Path(root)
        self.run = run
        self.policy = policy
        self.keep = keep

    def versions(self) -> list[int]:
        """Versions of the checkpoints present, newest first."""
        if not self.root.is_dir():
            return []
        found = [int(m.group(1)) for p in self.root.iterdir() if (m := _STEP.match(p.name))]
        return sorted(found, reverse=True)

    def path(self, version: int) -> Path:
        return self.root / f"step-{version:010d}"

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             meta: CheckpointMeta) -> Path:
        """Write a checkpoint of ``meta.version`` atomically; prune old ones. A sharded
        model's checkpoint is a collective: every rank calls this (only rank 0's ``meta``
        is written)."""
        from astraflow.consumers.trainer.sharding import is_sharded

        if is_sharded(model):
            return self._save_sharded(model, optimizer, meta)
        self.root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        tmp = self.root / f".tmp-step-{meta.version:010d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        opt_tensors, opt_meta = _optimizer_parts(optimizer)
        files = {"model.safetensors": _own(_model_tensors(model)),
                 "optimizer.safetensors": opt_tensors}
        digests = {}
        for name, tensors in files.items():
            save_file(tensors, str(tmp / name))
            _fsync_file(tmp / name)
            digests[name] = _sha256(tmp / name)
        return self._finish(tmp, meta, digests, {"format": FORMAT, "optimizer": opt_meta},
                            started)

    def _save_sharded(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      meta: CheckpointMeta) -> Path:
        import torch.distributed as dist

        from astraflow.consumers.trainer.sharded_checkpoint import save_shards

        started = time.monotonic()
        rank, world = dist.get_rank(), dist.get_world_size()
        pid = torch.tensor([os.getpid()], dtype=torch.int64, device=_comm_device())
        dist.broadcast(pid, src=0)  # every rank writes into rank 0's temporary directory
        tmp = self.root / f".tmp-step-{meta.version:010d}-{int(pid.item())}"
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        save_shards(model, optimizer, tmp / "dcp")  # returns after .metadata is written
        if rank != 0:
            return self.path(meta.version)
        digests = {}
        for file in sorted((tmp / "dcp").iterdir()):
            _fsync_file(file)
            digests[f"dcp/{file.name}"] = _sha256(file)
        _fsync_dir(tmp / "dcp")
        return self._finish(tmp, meta, digests,
                            {"format": FORMAT_DCP, "layout": "dcp", "world": world}, started)

    def _finish(self, tmp: Path, meta: CheckpointMeta, digests: dict[str, str],
                extra: dict[str, Any], started: float) -> Path:
        """RNG file, meta.json, rename into place, prune (rank 0)."""
        rng_tensors, rng_meta = _rng_parts()
        save_file(_own(rng_tensors), str(tmp / "rng.safetensors"))
        _fsync_file(tmp / "rng.safetensors")
        digests["rng.safetensors"] = _sha256(tmp / "rng.safetensors")
        meta_json = {**extra, "run": self.run, "policy": self.policy,
                     "version": meta.version,
                     "offsets": {t: {str(p): o for p, o in parts.items()}
                                 for t, parts in meta.offsets.items()},
                     "recent": list(meta.recent), "counters": dict(meta.counters),
                     "rng": rng_meta, "files": digests, "created_at": time.time()}
        with open(tmp / "meta.json", "w") as f:
            json.dump(meta_json, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        final = self.path(meta.version)
        if final.exists():  # a re-run of a version after a damaged newer checkpoint
            aside = self.root / f".old-{final.name}-{os.getpid()}"
            final.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
        tmp.rename(final)
        _fsync_dir(self.root)
        self._prune()
        log.info("checkpoint policy=%s version=%d path=%s seconds=%.3f", self.policy,
                 meta.version, final, time.monotonic() - started)
        return final

    def _prune(self) -> None:
        for v in self.versions()[self.keep:]:
            shutil.rmtree(self.path(v), ignore_errors=True)
        for p in self.root.iterdir():
            if p.name.startswith(".tmp-step-") and not p.name.endswith(f"-{os.getpid()}"):
                shutil.rmtree(p, ignore_errors=True)

    def read_meta(self, version: int) -> dict[str, Any]:
        """The meta of checkpoint ``version`` after checking its files' digests."""
        path = self.path(version)
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {path}: meta.json unreadable ({e})") from None
        if meta.get("format") not in (FORMAT, FORMAT_DCP):
            raise CheckpointError(f"checkpoint {path} has format {meta.get('format')}; this "
                                  f"build reads {FORMAT} and {FORMAT_DCP}")
        for name, digest in meta["files"].items():
            if not (path / name).is_file() or _sha256(path / name) != digest:
                raise CheckpointError(f"checkpoint {path}: {name} is missing or damaged")
        if (meta["run"], meta["policy"]) != (self.run, self.policy):
            raise CheckpointError(
                f"checkpoint {path} belongs to run={meta['run']} policy={meta['policy']}, not "
                f"run={self.run} policy={self.policy}; point trainer.checkpoint_dir elsewhere")
        return meta

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
             ) -> CheckpointMeta | None:
        """Restore the newest sound checkpoint into ``model`` and ``optimizer`` (and the RNGs);
        None when there is none. A damaged checkpoint is skipped with a warning; one of
        another run or policy is an error."""
        for version in self.versions():
            path = self.path(version)
            try:
                meta = self.read_meta(version)
            except CheckpointError as e:
                if "belongs to" in str(e):
                    raise
                log.warning("skipping damaged checkpoint: %s", e)
                continue
            self._load_tensors(path, meta, model, optimizer)
            _load_rng(load_file(str(path / "rng.safetensors")), meta["rng"])
            log.info("resumed policy=%s version=%d from %s", self.policy, version, path)
            return CheckpointMeta(
                version=int(meta["version"]),
                offsets={t: {int(p): int(o) for p, o in parts.items()}
                         for t, parts in meta["offsets"].items()},
                recent=list(meta["recent"]), counters=dict(meta.get("counters", {})))
        return None

    def _load_tensors(self, path: Path, meta: dict[str, Any], model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer) -> None:
        from astraflow.consumers.trainer import sharded_checkpoint as sc
        from astraflow.consumers.trainer.sharding import is_sharded

        if meta.get("layout") == "dcp":
            sc.load_shards(model, optimizer, path / "dcp")
            return
        weights = load_file(str(path / "model.safetensors"))
        if is_sharded(model):  # a single-file checkpoint into an fsdp trainer
            names = set(model.state_dict())
            if names != set(weights):
                raise CheckpointError(f"checkpoint {path} does not fit the model: missing "
                                      f"{sorted(names - set(weights))[:5]}, unexpected "
                                      f"{sorted(set(weights) - names)[:5]}")
            sc.load_full(model, optimizer, weights,
                         load_file(str(path / "optimizer.safetensors")), meta["optimizer"])
            return
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if _is_peft(model):  # LoRA: the frozen base is the model directory's
            missing = [k for k in missing if k in _model_tensors(model)]
        if missing or unexpected:
            raise CheckpointError(f"checkpoint {path} does not fit the model: missing "
                                  f"{missing[:5]}, unexpected {unexpected[:5]}")
        # load_state_dict moves each state tensor to its parameter's device (and keeps
        # AdamW's step counters where torch wants them)
        _load_optimizer(optimizer, load_file(str(path / "optimizer.safetensors")),
                        meta["optimizer"])
