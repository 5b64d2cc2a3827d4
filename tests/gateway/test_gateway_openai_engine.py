"""The ``openai`` rollout engine against the gateway: a real OpenAI-compatible server for the
engine's wire format (token-id prompts, ``return_token_ids``, logprobs, stop strings kept),
backed by the hf engine; tokens and logprobs come back exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway_helpers import teacher_forced

from astraflow.consumers.rollout.engines import GenRequest, build_engine


def test_openai_engine_generates_through_the_gateway(serve: Any, ascii_engine: Any,
                                                     ascii_dir: Path) -> None:
    served = serve(ascii_engine)
    tok = ascii_engine.tokenizer
    client = build_engine("openai", model_path=ascii_dir, base_url=served.url, tokenizer=tok)
    prompts = [tok(t)["input_ids"] for t in ("12+30=", "Hello, ")]
    results = client.generate([GenRequest(p, max_new_tokens=6) for p in prompts])
    for p, r in zip(prompts, results, strict=True):
        assert 1 <= len(r.token_ids) <= 6 and r.finish_reason in ("stop", "length")
        assert r.versions == [ascii_engine.version] * len(r.token_ids)
        forced = teacher_forced(ascii_engine.model, p + r.token_ids)[len(p):]
        assert max(abs(a - b) for a, b in zip(forced, r.logprobs, strict=True)) < 1e-4
    # stop strings stay in the output, as the engine asks (include_stop_str_in_output)
    (stopped,) = client.generate([GenRequest(prompts[0], max_new_tokens=40,
                                             stop=tuple("0123456789"))])
    text = tok.decode(stopped.token_ids)
    assert stopped.finish_reason == "length" or text[-1] in "0123456789" or text.endswith(
        tok.eos_token)
    assert served.events() == []  # the engine sends no session: nothing recorded
