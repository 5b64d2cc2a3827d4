"""A session's state, folded from its :class:`~astraflow.core.records.GatewayCall` events, and
where its next call continues.

Each recorded call names its parent, the call whose prompt + completion its own prompt extends
(``-1``: it starts a chain); a segment's trajectory is the chain that ends at its newest call.
:func:`plan`, a pure function of the state, decides where a request continues: on the recorded
tokens of the newest call or of an ancestor (a branch), on the tokens served for a reply sent
back unchanged, or, when the history has drifted, as ``on_drift`` says. Tokens are never
silently re-tokenised. The rules: docs/gateway.md#tokens-in-tokens-out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from astraflow.core.records import GatewayCall, GatewayChoice, unpack


@dataclass(slots=True)
class Choice:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    hidden: int = 0
    text: str = ""  # the text served for it ("": not recorded)

    @classmethod
    def of(cls, c: GatewayChoice) -> Choice:
        return cls(unpack(c.token_ids, "<i4").tolist(), unpack(c.logprobs, "<f4").tolist(),
                   unpack(c.versions, "<i4").tolist(), c.finish_reason, c.hidden, c.text)


@dataclass(slots=True)
class Call:
    seq: int
    policy: str
    segment: int
    parent: int
    parent_choice: int
    prompt_ids: list[int]  # after the parent's prompt + completion
    prompt_role: str
    n_messages: int
    choices: list[Choice]
    view_drop: int = 0  # the parent's trailing tokens the client's view of this prompt lacks
    view_ids: list[int] | None = None  # the client's view of the whole prompt, if set


@dataclass(slots=True)
class Plan:
    """Where a new call of ``policy`` goes: its whole ``prompt``, the part after its parent
    (``tail``), its parent (-1: none) and segment (None: a new one, numbered when recorded)."""

    prompt: list[int]
    tail: list[int]
    parent: int = -1
    parent_choice: int = 0
    segment: int | None = None
    role: str = "prompt"
    drift: bool = False
    branch: bool = False
    drop: int = 0  # the parent's hidden tokens the request's rendering lacks
    view: list[int] | None = None  # the request as rendered, where it is not the recorded


@dataclass
class Session:
    id: str
    task_id: str = ""
    group_id: str = ""
    sample_index: int = 0
    group_size: int = 1
    agent: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    calls: dict[int, Call] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)  # policy -> its newest call
    next_seq: int = 0
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    ended: bool = False
    done: bool = False
    drift: int = 0
    branches: int = 0
    keys: dict[str, bytes] = field(default_factory=dict)  # Idempotency-Key -> response
    opened_at: float = field(default_factory=time.time)
    owner: str = ""  # the client that opened it (see GatewayCall.owner)
    end_reason: str = ""  # "": ended by its client; "abandoned": idle past the timeout
    last_active: float = field(default_factory=time.time)  # its newest event's time
    busy: int = 0  # its calls being generated now (not expired while > 0)

    # -- folding events ------------------------------------------------------------------------
    def apply(self, ev: GatewayCall) -> None:
        """Take one event (live, after it was produced; or read back at a restart)."""
        self.next_seq = max(self.next_seq, ev.seq + 1)
        self.last_active = max(self.last_active, ev.created_at)
        if ev.call_id:
            self.keys[ev.call_id] = ev.response
        if ev.kind == "open":
            self.task_id, self.group_id = ev.task_id or self.id, ev.group_id or self.id
            self.sample_index, self.group_size = ev.sample_index, ev.group_size
            self.agent, self.metadata = ev.agent, dict(ev.metadata)
            self.opened_at, self.owner = ev.created_at, ev.owner
        elif ev.kind == "call":
            self.calls[ev.seq] = Call(ev.seq, ev.policy, ev.segment, ev.parent,
                                      ev.parent_choice, unpack(ev.prompt_ids, "<i4").tolist(),
                                      ev.prompt_role, ev.n_messages,
                                      [Choice.of(c) for c in ev.choices], ev.view_drop,
                                      unpack(ev.view_ids, "<i4").tolist() if ev.view_ids
                                      else None)
            self.heads[ev.policy] = ev.seq
            self.drift += ev.drift
            self.branches += ev.branch
        elif ev.kind == "reward":
            self.reward, self.rewards = ev.reward, dict(ev.rewards)
        elif ev.kind == "end":
            self.ended, self.end_reason = True, ev.reason
        elif ev.kind == "done":
            self.done = True

    # -- reading -------------------------------------------------------------------------------
    def next_segment(self, policy: str) -> int:
        return 1 + max((c.segment for c in self.calls.values() if c.policy == policy),
                       default=-1)

    def segments(self, policy: str) -> dict[int, int]:
        """Segment -> its newest call, for ``policy``."""
        out: dict[int, int] = {}
        for c in self.calls.values():
            if c.policy == policy:
                out[c.segment] = max(out.get(c.segment, -1), c.seq)
        return dict(sorted(out.items()))

    def policies(self) -> list[str]:
        return list(dict.fromkeys(c.policy for c in self.calls.values()))

    def chain(self, last: int) -> list[Call]:
        """The calls from the first of ``last``'s chain to ``last``."""
        out = []
        seq = last
        while seq >= 0:
            c = self.calls[seq]
            out.append(c)
            seq = c.parent
        return out[::-1]


@dataclass(slots=True)
class Link:
    """One call of a chain laid out as tokens: where its prompt and its completion end in the
    recorded sequence, and in the client's view of it (the same unless drift was continued)."""

    call: Call
    choice: int  # the choice the chain goes on with (the last call: 0)
    prompt_end: int
    end: int
    view: list[int]  # the client's view up to this call (a prefix of it is this call's)
    view_prompt_end: int
    view_end: int


def layout(chain: list[Call]) -> tuple[list[int], list[int], list[Link]]:
    """The recorded token sequence of a chain (each call's tail, then its completion on the
    chain), the client's view of it, and the calls' places in both."""
    seq: list[int] = []
    view: list[int] = []
    links = []
    for i, c in enumerate(chain):
        seq += c.prompt_ids
        if c.view_ids is not None:
            view = list(c.view_ids)
        else:
            view = view[:len(view) - c.view_drop] + c.prompt_ids
        prompt_end, view_prompt_end = len(seq), len(view)
        choice = chain[i + 1].parent_choice if i + 1 < len(chain) else 0
        out = c.choices[choice].token_ids if c.choices else []
        seq += out
        view += out
        links.append(Link(c, choice, prompt_end, len(seq), view, view_prompt_end, len(view)))
    return seq, view, links


def _extends(recorded: list[int], hidden: int, ids: list[int]) -> tuple[list[int], int] | None:
    """(the tokens ``ids`` adds after ``recorded``, how many of ``recorded``'s last ``hidden``
    tokens it leaves out: 0 or ``hidden``), or None when it does not extend it."""
    n = len(recorded)
    if ids[:n] == recorded:
        return ids[n:], 0
    if 0 < hidden <= n and ids[:n - hidden] == recorded[:n - hidden]:
        return ids[n - hidden:], hidden
    return None


def plan(s: Session, policy: str, ids: list[int], *, on_drift: str,
         appended: Callable[[int], tuple[list[int], str] | None] | None = None,
         role: Callable[[int], str] = lambda k: "other",
         reply: Callable[[int], str | None] | None = None,
         prefix: Callable[[int], list[int]] | None = None,
         text: tuple[Callable[[list[int]], str], Callable[[str], list[int]]] | None = None
         ) -> Plan:
    """Where a call of ``policy`` whose request renders to ``ids`` continues (see the module
    docstring). Chat requests give ``appended(k)``: the tokens and span role of the request's
    messages after its first ``k`` (None when it has no more), ``role(k)``: the span role
    of those messages, ``reply(k)``: the text of its message ``k`` if that is an assistant
    message (else None), and ``prefix(k)``: its first ``k`` messages rendered as a prompt.
    Text completions give ``text``: (the text of token ids, the token ids of a text)."""
    head = s.heads.get(policy)
    if head is None:
        return Plan(ids, ids)
    chain = s.chain(head)
    seq, _, links = layout(chain)
    last = links[-1]
    for j, ch in enumerate(last.call.choices):  # the newest call: any of its choices
        got = _extends(last.view[:last.view_prompt_end] + ch.token_ids, ch.hidden, ids)
        if got is not None:
            tail, drop = got
            return Plan(seq[:last.prompt_end] + ch.token_ids + tail, tail, last.call.seq, j,
                        last.call.segment, role(last.call.n_messages + 1), drop=drop)
    carried = reply(last.call.n_messages) if reply is not None else None
    if carried is not None:  # the request carries a reply where the newest call's goes
        served = _served(last, carried, appended, prefix)
        if served is not None:
            j, (after, span) = served
            return Plan(seq[:last.prompt_end] + last.call.choices[j].token_ids + after, after,
                        last.call.seq, j, last.call.segment, span, view=ids)
    if text is not None and carried is None:
        view = last.view[:last.view_prompt_end]
        if len(ids) > len(view) and ids[:len(view)] == view:  # the newest call's prompt, more
            rest = text[0](ids[len(view):])
            for j, ch in enumerate(last.call.choices):
                if ch.text and rest.startswith(ch.text):  # ... its served text, then more
                    after = text[1](rest[len(ch.text):])
                    return Plan(seq[:last.prompt_end] + ch.token_ids + after, after,
                                last.call.seq, j, last.call.segment, role(1), view=ids)
            carried = rest  # something else where its reply goes: an edit, not a branch
    for link in reversed(links[:-1] if carried is None else []):  # an ancestor (a branch)
        ch = link.call.choices[link.choice]
        got = _extends(link.view[:link.view_end], ch.hidden, ids)
        if got is not None:
            tail, drop = got
            return Plan(seq[:link.end] + tail, tail, link.call.seq, link.choice,
                        link.call.segment, role(link.call.n_messages + 1), branch=True,
                        drop=drop)
    root = links[0]
    if carried is None and ids == root.view[:root.view_prompt_end]:  # the first turn again
        return Plan(ids, ids, segment=root.call.segment, branch=True)
    if on_drift == "continue" and appended is not None and last.call.choices:
        new = appended(last.call.n_messages + 1)
        if new is not None:
            recorded = seq[:last.prompt_end] + last.call.choices[0].token_ids
            return Plan(recorded + new[0], new[0], last.call.seq, 0, last.call.segment, new[1],
                        drift=True, view=ids)
    return Plan(ids, ids, drift=True)


def _served(last: Link, carried: str, appended: Callable[[int], tuple[list[int], str] | None]
            | None, prefix: Callable[[int], list[int]] | None
            ) -> tuple[int, tuple[list[int], str]] | None:
    """(the choice of ``last`` whose served text is ``carried``, the tokens and span role of
    the request's messages after it) when the request's messages before the reply are the
    ones ``last`` was given (as its client's view renders them); else None."""
    n = last.call.n_messages
    js = [j for j, ch in enumerate(last.call.choices) if ch.text and ch.text == carried]
    if not js or appended is None or prefix is None:
        return None
    if prefix(n) != last.view[:last.view_prompt_end]:
        return None
    new = appended(n + 1)
    return None if new is None else (js[0], new)
