"""Which trainer versions a stage believes: a weight manifest is followed only when it could be
the trainer's.

Anyone who can produce to ``weights.<policy>`` can write a manifest, and a stage never fetches
blobs. So before a manifest moves a stage's version, it must be well-formed
(:func:`astraflow.weights.follow.manifest_problem`) and its version no newer than the batch
records written to ``batches.<policy>`` (the trainer takes one step per batch). A refused
manifest is dead-lettered; a trajectory claiming a newer token version is refused too.
Details: docs/policies.md#errors.
"""

from __future__ import annotations

import logging

from astraflow.core.bus.types import Bus
from astraflow.core.records import Trajectory, WeightManifest
from astraflow.core.topics import topic_name
from astraflow.policies.env import token_versions

log = logging.getLogger("astraflow.policies")


class VersionCheck:
    """The versions of ``run``'s trainers a stage may believe (see the module docstring)."""

    def __init__(self, bus: Bus, run: str, policies: tuple[str, ...]) -> None:
        self.bus = bus
        self.run = run
        self.policies = frozenset(policies)
        self._known: dict[str, int] = {}  # a bound read before (bounds only grow)

    def bound(self, policy: str) -> int:
        """The newest version ``policy``'s trainer can have made: the batch records written
        to ``batches.<policy>`` so far."""
        ends = self.bus.describe_topic(topic_name(self.run, "batches", policy)).end_offsets
        self._known[policy] = sum(ends.values())
        return self._known[policy]

    def token_problem(self, t: Trajectory) -> str | None:
        """Why the versions of ``t``'s generated tokens cannot be its trainer's, or None. The
        topic is described only when a version is above the bound read last."""
        newest = token_versions([t])[1]
        if newest <= self._known.get(t.policy, -1):
            return None
        if t.policy not in self.policies:
            return None  # the assembler refuses a trajectory of an unknown policy
        bound = self.bound(t.policy)
        if newest > bound:
            return (f"a token of version {newest}, but only {bound} batch records were ever "
                    f"written for policy {t.policy!r}: no trainer made that version")
        return None

    def problem(self, m: WeightManifest) -> str | None:
        """Why ``m`` is not to be believed, or None."""
        if m.policy not in self.policies:
            return (f"manifest of policy {m.policy!r}, which is not one of this run's "
                    f"({', '.join(sorted(self.policies))})")
        from astraflow.weights.follow import manifest_problem

        bad = manifest_problem(m)
        if bad is not None:
            return f"manifest of policy {m.policy!r} version {m.version}: {bad}"
        bound = self._known.get(m.policy, -1)
        if m.version > bound:  # bounds only grow: the topic is described only past the last
            bound = self.bound(m.policy)
        if m.version > bound:
            return (f"manifest of policy {m.policy!r} claims version {m.version}, but only "
                    f"{bound} batch records were ever written to "
                    f"{topic_name(self.run, 'batches', m.policy)}: no trainer made it")
        return None

    def restored(self, versions: dict[str, int]) -> dict[str, int]:
        """``versions`` from a checkpoint, each cut back to what its trainer can have made."""
        out = {}
        for policy, version in versions.items():
            bound = self.bound(policy) if policy in self.policies else 0
            if version > bound:
                log.warning("checkpointed version %d of policy %s is above the %d batch "
                            "records ever written for it (a forged manifest believed before "
                            "manifests were checked): using %d", version, policy, bound,
                            bound)
                version = bound
            out[policy] = version
        return out
