"""The gateway never loses a sampled token: an agent that sends back the text it was given
continues on the token ids the gateway served for it, even where that text does not
tokenize back to them (a special token the default ``skip_special_tokens`` left out of the
text); an agent that edits a reply is drift, counted and never a silent loss. Driven with the
official SDK and its defaults."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_helpers import arrays

REPLIES = {"one": "ab", "two": "c<pad>d", "three": "ef"}


def _rule(prompt: str) -> str:
    return next(v for k, v in REPLIES.items() if prompt.endswith(k))


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _completions(served: Any, ts: list[Any]) -> list[list[int]]:
    """The generated tokens (loss mask 1) of each trajectory, as runs."""
    out = []
    for t in ts:
        ids, mask, _, _ = arrays(t)
        runs, cur = [], []
        for i, m in zip(ids, mask, strict=True):
            if m:
                cur.append(i)
            elif cur:
                runs.append(cur)
                cur = []
        out.append(runs + ([cur] if cur else []))
    return out


def test_a_reply_with_a_special_token_keeps_its_sampled_tokens(
        serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, _rule), metrics=True)
    client = served.client("special")
    msgs: list[Any] = [user("one")]
    sampled = []
    for nxt in ("two", "three", None):
        r = client.chat.completions.create(model="default", messages=msgs,
                                           extra_body={"return_token_ids": True})
        sampled.append(r.choices[0].token_ids)  # type: ignore[attr-defined]
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}]
        if nxt:
            msgs.append(user(nxt))
    pad = ascii_tokenizer.pad_token_id
    assert pad in sampled[1] and msgs[3]["content"] == "cd"  # the pad is not in the text
    info = served.post("/sessions/special/end", {"reward": 1.0}).json()
    assert (info["drift"], info["branches"], info["trajectories"]) == (0, 0, 1)
    assert served.gw.metrics.counters.get("branches", 0.0) == 0.0
    (t,) = served.trajectories()
    assert _completions(served, [t]) == [sampled]  # every sampled token, in one trajectory


@pytest.mark.parametrize("mode", ["continue", "segment"])
def test_an_edited_reply_is_drift_and_loses_no_sampled_token(
        serve: Any, rule_engine: Any, ascii_tokenizer: Any, mode: str) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ab" if p.endswith("one") else "xy"),
                   on_drift=mode, metrics=True)
    client = served.client("edits")
    msgs: list[Any] = [user("one")]
    sampled = []
    for nxt in ("two", "three"):
        r = client.chat.completions.create(model="default", messages=msgs,
                                           extra_body={"return_token_ids": True})
        sampled.append(r.choices[0].token_ids)  # type: ignore[attr-defined]
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, user(nxt)]
    msgs[3]["content"] = "EDITED"  # the agent rewrites the model's second reply, goes on
    r = client.chat.completions.create(model="default", messages=msgs,
                                       extra_body={"return_token_ids": True})
    sampled.append(r.choices[0].token_ids)  # type: ignore[attr-defined]
    info = served.get("/sessions/edits").json()
    assert (info["drift"], info["branches"]) == (1, 0)  # drift, not a branch at turn 1
    counters = served.gw.metrics.counters
    assert (counters.get("drift"), counters.get("branches", 0.0)) == (1.0, 0.0)
    served.post("/sessions/edits/end", {"reward": 1.0})
    ts = served.trajectories()
    runs = [tuple(r) for t in _completions(served, ts) for r in t]
    assert sorted(runs) == sorted(map(tuple, sampled))  # each sampled turn, once
    texts = [ascii_tokenizer.decode(arrays(t)[0]) for t in ts]
    if mode == "segment":  # the edit starts a new trajectory; the first keeps its replies
        assert [t.id for t in ts] == ["edits/default/0", "edits/default/0.1"]
        assert "EDITED" not in texts[0] and "EDITED" in texts[1]
    else:  # continued on the tokens served: the model never saw the edit
        (text,) = texts
        assert text == "<bos>oneab<eos>twoxy<eos>threexy<eos>"


def test_a_text_completion_sent_back_keeps_its_sampled_tokens(
        serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, _rule), metrics=True)
    client = served.client("plain")
    prompt, sampled = "one", []
    for nxt in ("two", "three", None):
        r = client.completions.create(model="default", prompt=prompt,
                                      extra_body={"return_token_ids": True})
        sampled.append(r.choices[0].token_ids)  # type: ignore[attr-defined]
        prompt += r.choices[0].text + (nxt or "")
    assert ascii_tokenizer.pad_token_id in sampled[1]
    # an edit of the last reply: drift, not a branch
    client.completions.create(model="default", prompt=prompt[:-2] + "EDITEDone")
    info = served.post("/sessions/plain/end", {"reward": 1.0}).json()
    assert (info["drift"], info["branches"]) == (1, 0)
    ts = served.trajectories()
    assert _completions(served, ts)[0] == sampled  # the three turns, every sampled token
