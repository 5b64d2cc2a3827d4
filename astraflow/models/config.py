"""Config section ``models.<policy>``: where a policy's model lives, and :func:`model_dir`, which
resolves it (building a tiny model there first when asked to, importing a gguf file or fetching
a hub id once: :func:`astraflow.models.source.resolve`).

Only pydantic at import time (``astraflow.config`` imports this, and ``astraflow --help`` loads
that); torch and transformers load inside :func:`model_dir` when it builds or imports a model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import pydantic

from astraflow.core.config import Section
from astraflow.core.paths import expand
from astraflow.models.source import ModelInfo, describe_model, resolve

log = logging.getLogger("astraflow.models")


class ModelConfig(Section):
    """The model of one policy: a local Hugging Face folder (optionally built here as a tiny
    model), a .gguf file, a hub id or a shortcut (docs/models.md)."""

    path: str = pydantic.Field("{out}/models/{policy}",
                               description="HF model folder ({out}: run dir, {policy}), a "
                               ".gguf file (imported once into a cache folder), a hub id "
                               "(org/name) or smollm2-135m-instruct; see docs/models.md")
    build: Literal["none", "tiny-arith", "tiny-team", "tiny-tools", "tiny-ascii"] = \
        pydantic.Field("none", description="build a tiny model at `path` when it does not "
                       "exist (quickstart and tests; no downloads); tiny-team: arith plus "
                       "'?yesno' for a verifier's verdict; tiny-tools: arith plus what "
                       "'<tool>mul(17,23)</tool>' needs")
    seed: int = 0


def model_dir(model: ModelConfig, policy: str, out: str | Path = ".") -> Path:
    """The model directory of ``policy`` (``model.path`` with ``{out}`` and ``{policy}``
    filled in), built first when ``model.build`` names a tiny model and the directory has no
    model yet (atomically: built aside, then renamed, so concurrent callers agree). Without a
    build: a folder as it is; a .gguf file or a shortcut: the folder it is imported into
    (once, in the cache); a hub id: its snapshot (fetched where a hub is reachable); a
    ConfigError naming ``models.<policy>.path`` when it cannot be had."""
    raw = expand(model.path, out=out, policy=policy)  # as written: "./a/b" is no hub id
    path = Path(raw)
    if model.build == "none":
        return resolve(raw, key=f"models.{policy}.path",
                       progress=lambda msg: log.warning("policy=%s %s", policy, msg))
    if not (path / "config.json").exists():
        import shutil
        import tempfile

        from astraflow.models.source import cache_root
        from astraflow.models.tiny import built

        alphabet = model.build.removeprefix("tiny-")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
        try:  # built once a machine (the cache), copied into the run
            shutil.copytree(built(alphabet, model.seed, cache_root() / "tiny"), tmp,
                            dirs_exist_ok=True)
        except OSError as e:  # no cache to write: build it here
            log.warning("policy=%s tiny model cache unavailable (%s); building in place",
                        policy, e)
            from astraflow.models.tiny import build_into

            build_into(tmp, alphabet, model.seed)
        try:
            tmp.rename(path)
        except OSError:  # another process built it first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def describe(model: ModelConfig, policy: str, out: str | Path = ".") -> ModelInfo:
    """What ``policy``'s model path names and whether it will resolve, without loading or
    downloading anything (:func:`astraflow.models.source.describe_model`)."""
    return describe_model(expand(model.path, out=out, policy=policy), build=model.build,
                          key=f"models.{policy}.path")
