"""Read and write ``.safetensors`` files as raw bits, with numpy only (no torch).

The format: an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``), then the
data; offsets are relative to the end of the header. Files are memory-mapped for reading, so
a large checkpoint is not copied. Only BF16, F16 and F32 are weight dtypes here.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Mapping
from math import prod
from pathlib import Path

import numpy as np

from astraflow.core.errors import WeightIntegrityError
from astraflow.weights.bits import BY_SAFETENSORS, DType, dtype_info
from astraflow.weights.files import atomic_file

Bits = dict[str, tuple[str, np.ndarray]]
MAX_HEADER = 100 << 20
MAX_DIMS = 64  # numpy's limit


def read_safetensors(path: Path | str) -> tuple[Bits, dict[str, str]]:
    """(tensors as name → (dtype, read-only bits), metadata) of a safetensors file."""
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 8:
            raise WeightIntegrityError(f"{path}: {size} bytes is too short for a safetensors file")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (n,) = struct.unpack_from("<Q", mm, 0)
    if n > MAX_HEADER or 8 + n > size:
        raise WeightIntegrityError(f"{path}: header length {n} does not fit a {size}-byte file")
    try:
        header = json.loads(bytes(mm[8:8 + n]))
    except (ValueError, RecursionError) as e:  # RecursionError: nested past the parser's limit
        raise WeightIntegrityError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise WeightIntegrityError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise WeightIntegrityError(f"{path}: __metadata__ is {type(meta).__name__}, expected an "
                                   "object of strings")
    data = np.frombuffer(mm, dtype=np.uint8, offset=8 + n)
    out: Bits = {}
    for name, spec in header.items():
        info, shape, begin, end = _entry(path, name, spec)
        want = prod(shape) * info.bits.itemsize
        if not (0 <= begin <= end <= len(data)) or end - begin != want:
            raise WeightIntegrityError(
                f"{path}: tensor {name!r} ({info.safetensors}{shape}) has data_offsets "
                f"[{begin}, {end}] that "
                f"do not hold {want} bytes inside the {len(data)}-byte data section")
        raw = data[begin:end]
        if (8 + n + begin) % info.bits.itemsize:  # misaligned (a writer that did not sort): copy
            raw = raw.copy()
        out[name] = (info.name, raw.view(info.bits).reshape(shape))
    return out, {str(k): str(v) for k, v in meta.items()}


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry(path: Path, name: str, spec: object) -> tuple[DType, list[int], int, int]:
    """(dtype, shape, begin, end) of a header entry, each checked for its type: the header is
    read from a file (a checkpoint someone gave us), not trusted to be well formed."""
    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
        raise WeightIntegrityError(f"{path}: tensor {name!r} has a malformed entry {spec!r:.200}; "
                                   'expected {"dtype": ..., "shape": [...], '
                                   '"data_offsets": [begin, end]}')
    st_dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    info = BY_SAFETENSORS.get(st_dtype) if isinstance(st_dtype, str) else None
    if info is None:
        raise WeightIntegrityError(
            f"{path}: tensor {name!r} has dtype {st_dtype!r:.100}; the weights codec handles "
            f"{', '.join(BY_SAFETENSORS)}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(_is_int(d) and 0 <= d < 2**63 for d in shape)):
        raise WeightIntegrityError(f"{path}: tensor {name!r} has shape {shape!r:.100}; expected "
                                   f"a list of at most {MAX_DIMS} non-negative integers")
    if prod(d or 1 for d in shape) * info.bits.itemsize >= 2**63:  # numpy's bound, zeros aside
        raise WeightIntegrityError(f"{path}: tensor {name!r} has shape {shape!r:.100}, more "
                                   "elements than an array can address")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))):
        raise WeightIntegrityError(f"{path}: tensor {name!r} has data_offsets {offsets!r:.100}; "
                                   "expected [begin, end] (integers)")
    return info, shape, offsets[0], offsets[1]


def write_safetensors(path: Path | str, tensors: Mapping[str, tuple[str, np.ndarray]],
                      metadata: Mapping[str, str] | None = None) -> int:
    """Write tensors (name → (dtype, bits)) atomically; returns the file size. Wider dtypes
    come first, as the safetensors library writes them, so every tensor is aligned."""
    tensors = dict(sorted(tensors.items(),
                          key=lambda kv: -dtype_info(kv[1][0], tensor=kv[0]).bits.itemsize))
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, (dtype, bits) in tensors.items():
        info = dtype_info(dtype, tensor=name)
        header[name] = {"dtype": info.safetensors, "shape": list(bits.shape),
                        "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)  # the data section starts 8-byte aligned
    with atomic_file(Path(path)) as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for _dtype, bits in tensors.values():
            f.write(np.ascontiguousarray(bits).view(np.uint8).reshape(-1).data)
    return 8 + len(hjson) + offset
