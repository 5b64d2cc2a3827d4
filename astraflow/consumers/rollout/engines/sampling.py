"""Sampling and stop checks shared by the in-process engines (torch imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sample(logits: Any, temperature: Any, top_p: Any, generator: Any = None) -> tuple[Any, Any]:
    """Sample one token per row of ``logits`` [R, V]; return (tokens [R], logprobs [R]).

    ``temperature`` and ``top_p`` are [R] tensors. The logprob is that of the sampled token
    under the distribution it was sampled from: ``log_softmax(logits / T)``, restricted to the
    top-p nucleus and renormalised when ``top_p < 1``. Rows with ``T == 0`` are greedy (argmax;
    top-p ignored) and report the logprob under the unscaled distribution (T = 1).
    """
    import torch

    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    p = torch.where(greedy, torch.ones_like(top_p), top_p)
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    if bool((p < 1).any()):
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_logp.exp()
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each token
        outside = before >= p[:, None]  # the first token is always kept (before == 0)
        sorted_logp = sorted_logp.masked_fill(outside, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
        logp = torch.log_softmax(logp, dim=-1)
    sampled = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, chosen


class StopChecker:
    """Tells whether a sequence just hit a stop token or a stop string.

    Stop strings are matched on the decoded text (special tokens left out) of the newest
    generated tokens (a window long enough for the longest stop string), so a string split
    across tokens is found, and text of the prompt never matches. A stop string that is the
    text of a special token (``"<|im_end|>"``) stops at that token.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], stop_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        special = dict(zip(getattr(tokenizer, "all_special_tokens", []),
                           getattr(tokenizer, "all_special_ids", []), strict=False))
        self.stop = tuple(s for s in stop if s and s not in special)
        self.stop_token_ids = frozenset([*stop_token_ids, *(special[s] for s in stop
                                                            if s in special)])
        self.window = 2 * max((len(s) for s in self.stop), default=0) + 4

    def hit(self, generated: Sequence[int]) -> bool:
        if not generated:
            return False
        if generated[-1] in self.stop_token_ids:
            return True
        if not self.stop:
            return False
        text = self.tokenizer.decode(list(generated[-self.window:]), skip_special_tokens=True)
        return any(s in text for s in self.stop)


def eos_ids(tokenizer: Any, model_config: Any = None, generation_config: Any = None) -> set[int]:
    """Every EOS id the tokenizer, the model's config and its generation config name (an
    instruct model's generation config may add its end-of-turn token: Qwen2.5-Instruct lists
    ``<|im_end|>`` and ``<|endoftext|>``)."""
    ids: set[int] = set()
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(model_config, "eos_token_id", None),
                   getattr(generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return ids
