"""Loading a model folder: the model and its tokenizer, ready for batched generation and
training. Every role loads through :func:`load`, on a folder
:func:`astraflow.models.config.model_dir` resolved.

The tokenizer pads on the left and always has a pad token: its own, else its EOS token (pad
positions are always masked), else its unknown token; with neither, loading is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astraflow.core.errors import ConfigError


def quiet() -> None:
    """No progress bars from transformers (the roles log; the CLI draws its own)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def prepare_tokenizer(tok: Any, where: str | Path) -> Any:
    """``tok`` padding on the left, with a pad token (the module docstring says which)."""
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is not None:
            tok.pad_token = tok.eos_token
        elif getattr(tok, "unk_token", None) is not None:
            tok.pad_token = tok.unk_token
        else:
            raise ConfigError(f"the tokenizer of {where} has no pad, EOS or unknown token to "
                              "pad batches with: give it an EOS token (save it with "
                              "tokenizer.eos_token set)")
    return tok


def _plain_tokenizer(path: Path) -> bool:
    """A folder whose tokenizer transformers saved from a plain ``tokenizers`` one (what the
    tiny models and the gguf imports write)."""
    try:
        cfg = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return cfg.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a model folder, left padding, with a pad token. A plain saved one
    loads exactly as saved: ``AutoTokenizer`` would pick the model type's class and lay its
    normalizer and pre-tokenizer over it (a tiny model's character vocabulary would then lose
    spaces and newlines). Any other goes through ``AutoTokenizer``. The chat template is kept
    as the folder has it. (AutoTokenizer is imported only where it is used: importing it
    imports torch, ~3 CPU-s that `astraflow run` and `astraflow check` need not pay.)"""
    quiet()
    p = Path(path)
    if _plain_tokenizer(p):
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(p)
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(p)
    return prepare_tokenizer(tok, p)


def load(path: str | Path, *, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Load a model folder (safetensors weights; ``dtype`` default fp32, ``"auto"``: as
    saved) and its tokenizer (:func:`load_tokenizer`); the model's pad id is the tokenizer's
    where its config names none."""
    import torch
    from transformers import AutoModelForCausalLM

    quiet()
    p = Path(path)
    if not (p / "config.json").exists():
        gone = "" if p.exists() else " (it does not exist)"
        raise ConfigError(f"model folder {p} has no config.json{gone}; give models.<policy>.path a Hugging Face "
                          "model folder, a .gguf file, a hub id or a shortcut "
                          "(docs/models.md), or set models.<policy>.build to a tiny model")
    tok = load_tokenizer(p)
    model: Any = AutoModelForCausalLM.from_pretrained(p, dtype=dtype or torch.float32,
                                                      use_safetensors=True)
    model = model.to(device)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tok.pad_token_id
    return model, tok
