"""Replay a workload through a simulated engine and trainer (``astraflow bench replay``).

A workload recorded in a run directory, or drawn from a distribution, is run through a
discrete-event model of a continuously batching engine and a trainer, synchronously and
asynchronously, to compare them (docs/replay.md). Reads the bus through core only; imports no
role.

Modules:

- :mod:`.errors`: the replay's error.
- :mod:`.events`: the clock of every discrete-event model here: a heap of timed callbacks.
- :mod:`.recorded`: a workload from a run directory: its trajectories' turns and timings.
- :mod:`.simulate`: the discrete-event simulation of rollout feeding a trainer.
- :mod:`.workload`: what a replay runs: episodes as (decode tokens, wait seconds) segments."""

from astraflow.sim.errors import ReplayError
from astraflow.sim.simulate import Comparison, Result, SimConfig, compare, simulate, tail_share
from astraflow.sim.workload import Episode, Group, Segment, Workload, synthetic

__all__ = [
    "Comparison", "Episode", "Group", "ReplayError", "Result", "Segment", "SimConfig",
    "Workload", "compare", "simulate", "synthetic", "tail_share",
]
