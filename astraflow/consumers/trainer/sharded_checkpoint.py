"""The tensors of a sharded (fsdp) checkpoint, through ``torch.distributed.checkpoint`` (DCP).

:class:`~astraflow.consumers.trainer.checkpoint.CheckpointDir` owns the directory,
``meta.json`` and the digests; this module owns ``dcp/``: :func:`save_shards` (every rank its
shards, keyed by parameter name; a collective), :func:`load_shards` (at any world size, or
whole tensors into an unsharded model) and :func:`load_full` (a single-file checkpoint into a
sharded model). No pickle is run: DCP's ``.metadata`` is written with ``torch.save`` and read
with ``weights_only=True``, so stock DCP tools cannot read it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def _metadata_classes() -> list[Any]:
    import torch.distributed.checkpoint.metadata as m
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    return [m.Metadata, m.TensorStorageMetadata, m.BytesStorageMetadata,
            m.ChunkStorageMetadata, m.TensorProperties, m.MetadataIndex, m.StorageMeta,
            m._MEM_FORMAT_ENCODING, _StorageInfo, torch.Size]


def _writer(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    class SafeWriter(FileSystemWriter):
        """DCP's file writer whose ``.metadata`` is written by ``torch.save``."""

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

            metadata.version = CURRENT_DCP_VERSION
            metadata.storage_data = {wr.index: wr.storage_data
                                     for wrs in results for wr in wrs}
            # the reader sets its own (a pathlib.Path in it would need another global)
            metadata.storage_meta = None
            final = Path(self.path) / ".metadata"
            tmp = final.with_name(".metadata.tmp")
            with open(tmp, "wb") as f:
                torch.save(metadata, f)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(final)

    return SafeWriter(str(path))


def _reader(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        """DCP's file reader whose ``.metadata`` is read with ``weights_only=True``."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta
            from torch.serialization import safe_globals

            file = Path(self.path) / ".metadata"
            with open(file, "rb") as f, safe_globals(_metadata_classes()):
                metadata = torch.load(f, weights_only=True)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {"model": get_model_state_dict(model),
            "optimizer": get_optimizer_state_dict(model, optimizer)}


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Every rank: write this rank's shards of ``model`` and ``optimizer`` under ``path``
    (returns once the coordinator has written ``.metadata``)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(model, optimizer), storage_writer=_writer(path))


def load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Restore ``model`` and ``optimizer`` from the DCP checkpoint at ``path`` (written at
    any world size). A collective when the model is sharded; every rank reads alone when it
    is not."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from astraflow.consumers.trainer.sharding import is_sharded

    state = _state(model, optimizer)
    dcp.load(state, storage_reader=_reader(path), no_dist=not is_sharded(model))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_full(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              weights: dict[str, torch.Tensor], opt_tensors: dict[str, torch.Tensor],
              opt_meta: dict[str, Any]) -> None:
    """Restore a sharded ``model`` and its ``optimizer`` from the whole tensors of an
    unsharded (single-file) checkpoint: optimizer state numbered by parameter position
    (``state.<i>.<key>``) is renamed to the parameter names DCP's helpers use."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    full_weights: dict[str, Any] = dict(weights)  # (the API's value type is a union)
    set_model_state_dict(model, full_weights, options=full)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state: dict[str, Any] = {}  # parameter name -> its optimizer state
    for key, value in opt_tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(names[int(pid)], {})[name] = value
    for pid, values in opt_meta["scalars"].items():
        state.setdefault(names[int(pid)], {}).update(values)
    groups = [{**{k: (tuple(v) if isinstance(v, list) and k != "params" else v)
                  for k, v in g.items()}, "params": [names[i] for i in g["params"]]}
              for g in opt_meta["param_groups"]]
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups},
                             options=full)


def full_weights(path: Path) -> dict[str, torch.Tensor]:
    """The whole model weights of the DCP checkpoint at ``path``, by state-dict name, read
    without a model or a process group (to export a sharded checkpoint as safetensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = _reader(path)
    metadata = reader.read_metadata()
    state = {key: torch.empty(md.size, dtype=md.properties.dtype)
             for key, md in metadata.state_dict_metadata.items()
             if key.startswith("model.") and isinstance(md, TensorStorageMetadata)}
    nested: dict[str, Any] = {"model": {k[len("model."):]: v for k, v in state.items()}}
    dcp.load(nested, storage_reader=_reader(path), no_dist=True)
    return nested["model"]
