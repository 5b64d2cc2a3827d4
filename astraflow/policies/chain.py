"""A stage's chain of policies, run in order inside one process, with no bus in sight.

Each record goes through the policies in order: what a policy returns of its ``produces`` type
goes on to the next; anything else (a GroupStats) leaves the stage at once. Records released by
a policy's ``tick`` continue from the policy after it. At the end of each step the chain settles
``GroupStats.kept`` (a group a later policy dropped gets ``kept=False``) and reports what left
the stage to every ``on_emitted``. The chain owns the stage's
:class:`~astraflow.policies.base.Context`; ``snapshot``/``restore`` move the policies' states
to and from msgpack bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgspec

from astraflow.core.records import GroupStats, Record, TrajectoryGroup, WeightManifest
from astraflow.policies.base import Context, GroupRef, Policy, split

log = logging.getLogger("astraflow.policies")


class Chain:
    """Policies of one stage with their states; see the module docstring."""

    def __init__(self, stage: str, policies: list[tuple[str, Policy]], *, seed: int = 0) -> None:
        self.stage = stage
        self.entries = [entry for entry, _ in policies]
        self.policies = [p for _, p in policies]
        self.states: list[Any] = [p.init_state() for p in self.policies]
        self.ctx = Context(seed=seed)

    # ------------------------------------------------------------------ main flow

    def _run(self, start: int, flow: list[Record], dropped: set[tuple[str, str, str]]
             ) -> tuple[list[Record], list[Record]]:
        """Run ``flow`` through the policies from ``start`` on; (main flow out, side outputs).
        Adds to ``dropped`` the (policy, agent, group id) of each group a policy dropped."""
        side: list[Record] = []
        for i in range(start, len(self.policies)):
            if not flow:
                break
            p, state = self.policies[i], self.states[i]
            holds = getattr(p, "holds_groups", False)
            nxt: list[Record] = []
            for r in flow:
                main, extra = split(p.process(r, state, self.ctx), p.produces)
                if isinstance(r, TrajectoryGroup) and not holds and not any(
                        isinstance(o, TrajectoryGroup) and _key(o) == _key(r) for o in main):
                    dropped.add(_key(r))
                nxt.extend(main)
                side.extend(extra)
            flow = nxt
        return flow, side

    @staticmethod
    def _settle(side: list[Record], dropped: set[tuple[str, str, str]]) -> list[Record]:
        """Side outputs with each GroupStats of a group dropped in this step marked
        ``kept=False`` (see the module docstring)."""
        if not dropped:
            return side
        return [msgspec.structs.replace(r, kept=False)
                if isinstance(r, GroupStats) and r.kept and _key(r) in dropped else r
                for r in side]

    def _emitted(self, flow: list[Record]) -> None:
        for p, state in zip(self.policies, self.states, strict=True):
            hook = getattr(p, "on_emitted", None)
            if hook is not None:
                hook(flow, state, self.ctx)

    def feed(self, record: Record) -> list[Record]:
        """Run one input record through the chain; the stage's outputs, main flow first."""
        dropped: set[tuple[str, str, str]] = set()
        flow, side = self._run(0, [record], dropped)
        self._emitted(flow)
        return flow + self._settle(side, dropped)

    def run(self, records: Iterable[Record]) -> list[Record]:
        """Feed many records (then tick once); every output in order. For tests and tools."""
        out: list[Record] = []
        for r in records:
            out.extend(self.feed(r))
        out.extend(self.tick())
        return out

    def tick(self) -> list[Record]:
        """Let every policy release what time or capacity allows (timeouts, held tasks)."""
        flow_out: list[Record] = []
        side_out: list[Record] = []
        dropped: set[tuple[str, str, str]] = set()
        for i, p in enumerate(self.policies):
            hook = getattr(p, "tick", None)
            if hook is None:
                continue
            released = hook(self.states[i], self.ctx)
            if not released:
                continue
            main, extra = split(released, p.produces)
            side_out.extend(extra)
            flow, side = self._run(i + 1, main, dropped)
            flow_out.extend(flow)
            side_out.extend(side)
        if flow_out or side_out:
            self._emitted(flow_out)
        return flow_out + self._settle(side_out, dropped)

    # ---------------------------------------------------------------- side inputs

    def side(self, record: Any) -> None:
        """A side input: a WeightManifest (trainer version), a GroupStats (``stats``) or the
        head of a group accepted onto ``groups.<policy>``."""
        if isinstance(record, WeightManifest):
            self.set_version(record.policy, record.version)
            return
        if isinstance(record, GroupStats):
            name = "on_stats"
        elif isinstance(record, GroupRef | TrajectoryGroup):
            name = "on_group"
        else:
            raise TypeError(f"no side input of type {type(record).__name__}")
        for p, state in zip(self.policies, self.states, strict=True):
            hook = getattr(p, name, None)
            if hook is not None:
                hook(record, state, self.ctx)

    def set_version(self, policy: str, version: int) -> bool:
        """Record a trainer version (the newest wins); True if it advanced."""
        old = self.ctx.versions.get(policy)
        if old is not None and version <= old:
            return False
        self.ctx.versions[policy] = version
        for p, state in zip(self.policies, self.states, strict=True):
            hook = getattr(p, "on_version", None)
            if hook is not None:
                hook(policy, 0 if old is None else old, version, state, self.ctx)
        return True

    # -------------------------------------------------------------------- queries

    def ready(self) -> bool:
        """False while a policy holds records back (the stage then reads no main input)."""
        return all(getattr(p, "ready", lambda s: True)(s)
                   for p, s in zip(self.policies, self.states, strict=True))

    def wants(self) -> set[str]:
        return {w for p in self.policies for w in getattr(p, "wants", ())}

    def counters(self) -> dict[str, float]:
        """Every policy's counters and levels as ``<entry>.<name>``."""
        out: dict[str, float] = {}
        for entry, p, state in zip(self.entries, self.policies, self.states, strict=True):
            hook = getattr(p, "counters", None)
            counts = hook(state) if hook is not None else getattr(state, "counts", {})
            out.update({f"{self._prefix(entry, p)}.{k}": v for k, v in counts.items()})
        return out

    def levels(self) -> set[str]:
        """The names in :meth:`counters` that are current values (a policy's ``levels``:
        queue lengths, probabilities), exported as gauges rather than counters."""
        return {f"{self._prefix(entry, p)}.{k}"
                for entry, p in zip(self.entries, self.policies, strict=True)
                for k in getattr(p, "levels", ())}

    @staticmethod
    def _prefix(entry: str, policy: Any) -> str:
        return policy.name if ":" in entry else entry

    # ---------------------------------------------------------------- checkpoints

    def snapshot(self) -> dict[str, bytes]:
        return {entry: msgspec.msgpack.encode(state)
                for entry, state in zip(self.entries, self.states, strict=True)}

    def restore(self, states: dict[str, bytes]) -> None:
        for i, entry in enumerate(self.entries):
            data = states.get(entry)
            if data is None:
                log.warning("stage=%s policy=%s has no state in the checkpoint; starting it "
                            "fresh", self.stage, entry)
                continue
            self.states[i] = msgspec.msgpack.decode(data, type=type(self.states[i]))
        extra = sorted(set(states) - set(self.entries))
        if extra:
            log.warning("stage=%s checkpoint holds state of %s, no longer configured; ignored",
                        self.stage, ", ".join(extra))


def _key(r: TrajectoryGroup | GroupStats) -> tuple[str, str, str]:
    return r.policy, r.agent, r.group_id
