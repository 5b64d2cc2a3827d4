"""Where a session's next call continues (token-in/token-out): the pure planner on a folded
session, then a client that edits its history, handled per ``gateway.on_drift``."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from gateway_helpers import arrays

from astraflow.core.records import GatewayCall, GatewayChoice, pack_f32, pack_i32
from astraflow.gateway.limits import TOKENIZER_THREAD
from astraflow.gateway.session import Session, plan

EOS = 2


def call(seq: int, prompt: list[int], out: list[int], *, parent: int = -1, hidden: int = 0,
         segment: int = 0, n_messages: int = 1, view: list[int] | None = None,
         drop: int = 0) -> GatewayCall:
    return GatewayCall(session_id="s", seq=seq, kind="call", policy="p", segment=segment,
                       parent=parent, prompt_ids=pack_i32(prompt), n_messages=n_messages,
                       view_drop=drop,
                       view_ids=b"" if view is None else pack_i32(view),
                       choices=[GatewayChoice(token_ids=pack_i32(out),
                                              logprobs=pack_f32([-1.0] * len(out)),
                                              versions=pack_i32([0] * len(out)),
                                              hidden=hidden)])


def session(*events: GatewayCall) -> Session:
    s = Session("s")
    for ev in events:
        s.apply(ev)
    return s


def test_plan_continues_branches_and_drifts() -> None:
    assert plan(Session("s"), "p", [1, 5], on_drift="continue").segment is None  # first call
    # turn 1: prompt [1 5], completion [6 7 EOS] whose text leaves the EOS out (hidden 1)
    s = session(call(0, [1, 5], [6, 7, EOS], hidden=1))
    exact = plan(s, "p", [1, 5, 6, 7, EOS, 9], on_drift="continue")
    assert (exact.parent, exact.tail, exact.drift) == (0, [9], False)
    # a template that does not write the EOS back: all the recorded tokens are kept
    no_eos = plan(s, "p", [1, 5, 6, 7, 9, 9], on_drift="segment")
    assert no_eos.prompt == [1, 5, 6, 7, EOS, 9, 9] and no_eos.tail == [9, 9]
    assert not no_eos.drift and no_eos.segment == 0
    assert plan(s, "p", [1, 5], on_drift="segment").branch  # the first turn again
    # the template never writes the EOS back: turn 2 was planned without it, and so is turn 3
    t = session(call(0, [1, 5], [6, 7, EOS], hidden=1),
                call(1, [9], [8, EOS], parent=0, hidden=1, n_messages=3, drop=no_eos.drop))
    assert no_eos.drop == 1
    third = plan(t, "p", [1, 5, 6, 7, 9, 8, 3], on_drift="segment")
    assert (third.parent, third.drift, third.drop) == (1, False, 1)
    assert third.prompt == [1, 5, 6, 7, EOS, 9, 8, EOS, 3]
    # turn 2 continues turn 1; a request that extends turn 1 again is a branch at turn 1
    s.apply(call(1, [9], [8, EOS], parent=0, hidden=1, n_messages=3))
    back = plan(s, "p", [1, 5, 6, 7, EOS, 3], on_drift="segment")
    assert (back.parent, back.branch, back.drift, back.tail) == (0, True, False, [3])
    # an edited history drifts: segment starts over from the rendering ...
    edited = [1, 4, 6, 7, 9, 8, 3]
    seg = plan(s, "p", edited, on_drift="segment")
    assert (seg.drift, seg.segment, seg.parent, seg.prompt) == (True, None, -1, edited)
    # ... continue keeps the recorded tokens and appends the new messages' tokens
    cont = plan(s, "p", edited, on_drift="continue",
                appended=lambda k: ([3, 3], "tool") if k == 4 else None)
    assert cont.drift and (cont.parent, cont.segment, cont.role) == (1, 0, "tool")
    assert cont.prompt == [1, 5, 6, 7, EOS, 9, 8, EOS, 3, 3] and cont.view == edited
    # ... unless the request adds no message after the recorded history
    short = plan(s, "p", edited, on_drift="continue", appended=lambda k: None)
    assert short.drift and short.segment is None
    # the next turn extends the client's view: continued on the recorded tokens, no drift
    s.apply(call(2, [3, 3], [4, EOS], parent=1, hidden=1, n_messages=5, view=edited))
    nxt = plan(s, "p", [*edited, 4, 6], on_drift="continue")
    assert (nxt.drift, nxt.parent, nxt.tail) == (False, 2, [6])
    assert nxt.prompt == [1, 5, 6, 7, EOS, 9, 8, EOS, 3, 3, 4, EOS, 6]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize("mode", ["continue", "segment"])
def test_an_edited_history_is_drift_handled_per_mode(serve: Any, rule_engine: Any,
                                                     ascii_tokenizer: Any, mode: str) -> None:
    engine = rule_engine(ascii_tokenizer, lambda prompt: f"ok{len(prompt)}")
    served = serve(engine, on_drift=mode)
    client = served.client("drifty")
    r1 = client.chat.completions.create(model="default", messages=[user("first")])
    a1 = r1.choices[0].message
    assert a1.content == "ok5"
    # the client rewrites its first message, then goes on
    r2 = client.chat.completions.create(model="default",
                                        messages=[user("FIRST"), a1, user("second")])
    assert served.get("/sessions/drifty").json()["drift"] == 1
    # the next turn extends what was recorded for the second call: no more drift
    client.chat.completions.create(model="default", messages=[
        user("FIRST"), a1, user("second"), r2.choices[0].message, user("third")])
    assert served.post("/sessions/drifty/end", {"reward": 1.0}).json()["done"] is True
    info = served.get("/sessions/drifty").json()
    assert info["drift"] == 1
    ts = served.trajectories()
    texts = [ascii_tokenizer.decode(arrays(t)[0]) for t in ts]
    if mode == "continue":
        # one trajectory on the recorded tokens: "first", never the edit
        (text,) = texts
        assert text == "<bos>firstok5<eos>secondok14<eos>thirdok23<eos>"
        assert [s.role for s in ts[0].spans] == ["prompt", "assistant", "user", "assistant",
                                                  "user", "assistant"]
    else:
        # the first segment as recorded, the second from the edited history as rendered
        assert [t.id for t in ts] == ["drifty/default/0", "drifty/default/0.1"]
        assert texts == ["<bos>firstok5<eos>",
                         "<bos>FIRSTok5secondok14<eos>thirdok23<eos>"]
        _, mask, _, _ = arrays(ts[1])
        assert sum(mask) == len("ok14") + 1 + len("ok23") + 1  # the client's "ok5" is prompt


class RecordingTokenizer:
    """The real tokenizer, recording which thread encoded each text (through ``__call__``:
    no fast backend)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.encoded: list[tuple[str, str]] = []  # (thread name, text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def __len__(self) -> int:
        return len(self._tok)

    def __call__(self, text: Any, **kwargs: Any) -> Any:
        self.encoded.append((threading.current_thread().name, str(text)))
        return self._tok(text, **kwargs)

    @property
    def backend_tokenizer(self) -> Any:
        return None


def test_a_continued_drift_is_tokenized_off_the_event_loop(serve: Any, rule_engine: Any,
                                                           ascii_tokenizer: Any) -> None:
    """The messages a drifted call adds are tokenized when the call is planned, as long as
    they are: on a tokenizer thread, never on the event loop that answers /health; the drift
    is counted and the trajectory is the recorded one, as on the loop."""
    tok = RecordingTokenizer(ascii_tokenizer)
    served = serve(rule_engine(tok, lambda prompt: f"ok{len(prompt)}"), on_drift="continue")
    client = served.client("drifty")
    a1 = client.chat.completions.create(model="default",
                                        messages=[user("first")]).choices[0].message
    tok.encoded.clear()
    client.chat.completions.create(model="default",
                                   messages=[user("FIRST"), a1, user("second")])
    assert served.get("/sessions/drifty").json()["drift"] == 1
    added = [t for t, text in tok.encoded if text == "second"]
    assert added, tok.encoded  # the added message, encoded on its own (appended)
    gateway = [t for t, _ in tok.encoded if not t.startswith("af-engine")]  # not the replies
    assert all(t.startswith(TOKENIZER_THREAD) for t in [*added, *gateway]), tok.encoded
    assert served.post("/sessions/drifty/end", {"reward": 1.0}).json()["done"] is True
    (t,) = served.trajectories()
    assert ascii_tokenizer.decode(arrays(t)[0]) == "<bos>firstok5<eos>secondok14<eos>"
    assert [s.role for s in t.spans] == ["prompt", "assistant", "user", "assistant"]
