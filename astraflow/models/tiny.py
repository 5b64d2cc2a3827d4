"""A character-level tokenizer and a tiny Qwen2 model, made in code.

>>> tok = build_tokenizer("arith")            # 17 tokens: <pad> <bos> <eos> 0-9 + - * =
>>> model = build_model(tok, seed=0)          # ~0.53M parameters
>>> save(model, tok, "runs/tiny")             # a normal Hugging Face model directory

The tokenizer splits every character, prepends ``<bos>``, pads on the left, and decodes
without spaces between characters. Its chat template concatenates message contents, so
``apply_chat_template`` works for workflows that build prompts from messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<bos>", "<eos>"]
ALPHABETS = {
    "arith": "0123456789+-*=",
    # arith plus what a verifier needs to judge a claim "12+34=47?": its own sum, a newline,
    # then "yes" or "no" ("46\nno")
    "team": "0123456789+-*=?yesno\n",
    # arith plus what a short tool call needs: "<tool>mul(17,23)</tool>", a result line
    "tools": "0123456789+-*=<>/(),adlmotu\n",
    # printable ASCII and newline: enough for tool calls and JSON in multi-turn tests
    "ascii": "".join(chr(c) for c in range(32, 127)) + "\n",
}
#: alphabets whose tokenizer has an <unk> token: a tool's output or error text may hold any
#: character ("error: unknown tool 'x'"); without it, encoding that text fails the episode
WITH_UNK = {"tools"}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def build_tokenizer(alphabet: str = "arith") -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer over a named alphabet (or a literal string of chars)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = ALPHABETS.get(alphabet, alphabet)
    if len(set(chars)) != len(chars) or not chars:
        raise ConfigError(f"alphabet {alphabet!r}: give a name ({', '.join(ALPHABETS)}) or a "
                          "string of distinct characters")
    # an alphabet that meets text it was not built for (tool outputs, error messages) maps
    # every other character to <unk>, last in the vocabulary (the others' ids unchanged)
    unk = "<unk>" if alphabet in WITH_UNK else None
    vocab = {t: i for i, t in enumerate(SPECIALS + list(chars) + ([unk] if unk else []))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    # Every character is its own token (spaces included): Split on the empty pattern.
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", padding_side="left",
                                   **({"unk_token": unk} if unk else {}))
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: Any, *, hidden: int = 128, layers: int = 2, heads: int = 4,
                intermediate: int = 512, max_positions: int = 64, seed: int = 0
                ) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM sized for ``tokenizer`` (fp32, CPU)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=intermediate,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def save(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """Save model and tokenizer as a Hugging Face directory (safetensors weights)."""
    from astraflow.models.load import quiet

    quiet()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_into(folder: str | Path, alphabet: str, seed: int) -> Path:
    """The tiny model of ``alphabet`` and ``seed``, built and saved in ``folder``."""
    tok = build_tokenizer(alphabet)
    return save(build_model(tok, seed=seed), tok, folder)


def built(alphabet: str, seed: int, cache: Path) -> Path:
    """The tiny model of ``alphabet`` and ``seed`` as :func:`build_into` writes it, built once
    into ``cache`` (aside, then renamed into place, as imports are) and reused: a run that
    builds one copies it from there instead of importing torch and transformers to make it
    again. The entry's name holds a digest of this module and of the versions of the
    libraries that shape the files, so a change to either builds anew."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    from astraflow.models.importer import aside, place
    from astraflow.models.source import has_model

    h = hashlib.sha256(Path(__file__).read_bytes())
    for package in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            h.update(f"{package}={version(package)};".encode())
        except PackageNotFoundError:
            h.update(f"{package}=?;".encode())
    entry = cache / f"tiny-{alphabet}-seed{seed}-{h.hexdigest()[:16]}"
    if has_model(entry):
        return entry
    return place(build_into(aside(entry), alphabet, seed), entry)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer :func:`save` wrote, exactly as saved (see
    :func:`astraflow.models.load.load_tokenizer`)."""
    from astraflow.models.load import load_tokenizer as load_any

    return load_any(path)


def load(path: str | Path, *, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Load a model folder saved by :func:`save`, or any other model folder: the entry point
    every role calls (:func:`astraflow.models.load.load`)."""
    from astraflow.models.load import load as load_any

    return load_any(path, device=device, dtype=dtype)
