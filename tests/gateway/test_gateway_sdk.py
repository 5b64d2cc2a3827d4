"""The gateway through the official ``openai`` SDK on the tiny model: chat, streaming, n > 1,
completions, models; and an agent loop written only against the SDK whose episode comes out
as a trajectory with the sampled tokens and teacher-forced logprobs."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from gateway_helpers import arrays, check_error, teacher_forced

USER = [{"role": "user", "content": "Say hi."}]


def test_chat_stream_n_models_and_completions(serve: Any, ascii_engine: Any) -> None:
    served = serve(ascii_engine, sampling={"max_new_tokens": 8})
    client = served.client()  # no session: served, not recorded
    r = client.chat.completions.create(model="default", messages=USER, logprobs=True,
                                       top_logprobs=1)
    (choice,) = r.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(ascii_engine.tokenizer("Say hi.")["input_ids"])
    assert r.usage.completion_tokens >= 1
    entries = choice.logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert all(e.logprob <= 0 and [t.token for t in e.top_logprobs] == [e.token]
               for e in entries)

    r2 = client.chat.completions.create(model="default", messages=USER, n=3, max_tokens=4,
                                        extra_body={"return_token_ids": True})
    assert [c.index for c in r2.choices] == [0, 1, 2]
    assert all(1 <= len(c.model_extra["token_ids"]) <= 4 for c in r2.choices)
    assert r2.usage.completion_tokens == sum(len(c.model_extra["token_ids"])
                                             for c in r2.choices)

    chunks = list(client.chat.completions.create(
        model="default", messages=USER, stream=True, n=2, stream_options={"include_usage": True}))
    text = {0: "", 1: ""}
    finish = {}
    for ch in chunks[:-1]:
        (c,) = ch.choices
        text[c.index] += c.delta.content or ""
        if c.finish_reason:
            finish[c.index] = c.finish_reason
    assert set(finish) == {0, 1} and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens >= 2
    assert all(t for t in text.values())

    assert [m.id for m in client.models.list()] == ["default"]
    assert client.models.retrieve("default").owned_by == "astraflow"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert e.value.body["code"] == "model_not_found"

    c = client.completions.create(model="default", prompt="12+3=", max_tokens=5, logprobs=1)
    assert len(c.choices[0].logprobs.tokens) == len(c.choices[0].logprobs.token_logprobs) <= 5
    ids = ascii_engine.tokenizer("12+3=")["input_ids"]
    c2 = client.completions.create(model="default", prompt=ids, max_tokens=3,
                                   extra_body={"return_token_ids": True})
    assert c2.usage.prompt_tokens == len(ids) and len(c2.choices[0].model_extra["token_ids"]) <= 3
    assert served.events() == []  # no session: nothing recorded
    check_error(served.post("/v1/completions", {"prompt": [10**9]}), 400, "invalid_prompt")


def agent_loop(served: Any, sid: str, turns: int = 3) -> list[list[int]]:
    """A multi-turn agent written only against the SDK (base_url = its session), then its
    reward and end. Returns the token ids sampled in each turn."""
    client = served.client(sid)
    messages: list[Any] = [{"role": "system", "content": "You add."},
                           {"role": "user", "content": "What is 2+3?"}]
    sampled: list[list[int]] = []
    for turn in range(turns):
        r = client.chat.completions.create(
            model="default", messages=messages, temperature=1.0, top_p=1.0,
            extra_body={"return_token_ids": True, "skip_special_tokens": False})
        sampled.append(r.choices[0].model_extra["token_ids"])
        messages.append(r.choices[0].message)  # the SDK's own message object, echoed back
        messages.append({"role": "user", "content": f"Check step {turn}."})
    assert served.post(f"/sessions/{sid}/reward", {"reward": 0.5}).status_code == 200
    end = served.post(f"/sessions/{sid}/end").json()
    assert end["done"] is True and end["trajectories"] == 1
    return sampled


def check_sampled(t: Any, sampled: list[list[int]], engine: Any) -> None:
    """``t``'s generated tokens are exactly the ``sampled`` ones, its logprobs equal a
    teacher-forced forward of the model (temperature 1, top_p 1), the rest masked out."""
    ids, mask, logprobs, versions = arrays(t)
    assert t.reward == 0.5 and t.group_size == 1
    assert [i for i, m in zip(ids, mask, strict=True) if m] == [x for s in sampled for x in s]
    assert [s.role for s in t.spans] == ["prompt", "assistant", "user", "assistant", "user",
                                         "assistant"]
    forced = teacher_forced(engine.model, ids)
    gen = [(a, b) for a, b, m in zip(logprobs, forced, mask, strict=True) if m]
    assert max(abs(a - b) for a, b in gen) < 1e-4
    assert all(lp == 0.0 and v == -1 for lp, v, m in zip(logprobs, versions, mask, strict=True)
               if not m)
    assert all(v == engine.version for v, m in zip(versions, mask, strict=True) if m)


def test_agent_loop_becomes_a_trajectory_of_what_was_sampled(serve: Any,
                                                             ascii_engine: Any) -> None:
    """A multi-turn agent loop: one trajectory of exactly what was sampled."""
    served = serve(ascii_engine, sampling={"max_new_tokens": 12})
    sampled = agent_loop(served, "episode-1")
    (t,) = served.trajectories()
    assert t.id == "episode-1/default/0"
    check_sampled(t, sampled, ascii_engine)
    info = served.get("/sessions/episode-1").json()
    assert info["calls"] == 3 and info["done"] is True
    # every turn's history extended the recorded tokens: the special tokens the random model
    # writes travel as text (skip_special_tokens: false) and come back as the same tokens
    assert info["drift"] == 0 and info["segments"] == {"default": 1}
    assert served.gw.store.open_count == 0


def test_concurrent_agents_over_a_continuously_batching_engine(
        serve: Any, ascii_continuous_engine: Any) -> None:
    """Eight agent loops at once over an engine that batches continuously (their requests join
    and leave the running batch between decoding steps): each session's trajectory is exactly
    what it sampled, logprobs as a teacher-forced forward of the model alone."""
    from concurrent.futures import ThreadPoolExecutor

    engine = ascii_continuous_engine
    joins = engine.decoder.joins
    served = serve(engine, sampling={"max_new_tokens": 12})
    sids = [f"agent-{i}" for i in range(8)]
    with ThreadPoolExecutor(len(sids)) as pool:
        sampled = dict(zip(sids, pool.map(lambda sid: agent_loop(served, sid), sids),
                           strict=True))
    trajectories = {t.id.split("/")[0]: t for t in served.trajectories()}
    assert sorted(trajectories) == sorted(sids)
    for sid in sids:
        check_sampled(trajectories[sid], sampled[sid], engine)
    assert engine.decoder.joins > joins  # some requests joined a batch already running
