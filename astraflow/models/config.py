"""Config section ``models.<policy>``: where a policy's model lives, and :func:`model_dir`, which
resolves it (building a tiny model there first when asked to).

Only pydantic at import time (``astraflow.config`` imports this, and ``astraflow --help`` loads
that); torch and transformers load inside :func:`model_dir` when it builds a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic

from astraflow.core.config import Section
from astraflow.core.paths import expand


class ModelConfig(Section):
    """The model of one policy: a local Hugging Face directory, optionally built here."""

    path: str = pydantic.Field("{out}/models/{policy}",
                               description="HF model directory ({out}: run dir, {policy})")
    build: Literal["none", "tiny-arith", "tiny-team", "tiny-tools", "tiny-ascii"] = \
        pydantic.Field("none", description="build a tiny model at `path` when it does not "
                       "exist (quickstart and tests; no downloads); tiny-team: arith plus "
                       "'?yesno' for a verifier's verdict; tiny-tools: arith plus what "
                       "'<tool>mul(17,23)</tool>' needs")
    seed: int = 0


def model_dir(model: ModelConfig, policy: str, out: str | Path = ".") -> Path:
    """The model directory of ``policy`` (``model.path`` with ``{out}`` and ``{policy}``
    filled in), built first when ``model.build`` names a tiny model and the directory has no
    model yet (atomically: built aside, then renamed, so concurrent callers agree)."""
    path = Path(expand(model.path, out=out, policy=policy))
    if model.build != "none" and not (path / "config.json").exists():
        import tempfile

        from astraflow.models.tiny import build_model, build_tokenizer, save

        tok = build_tokenizer(model.build.removeprefix("tiny-"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
        save(build_model(tok, seed=model.seed), tok, tmp)
        try:
            tmp.rename(path)
        except OSError:  # another process built it first: use theirs
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return path
