"""Replay a workload through a simulated engine and trainer (``astraflow bench replay``).

A workload recorded on GPUs (a run directory's trajectories: generated tokens per turn and the
waits between turns) or drawn from a distribution is run through a discrete-event model of a
continuously batching engine and a trainer, once synchronously and once asynchronously, to
compare trainer wait, effective samples/s and the tail of episode times (docs/replay.md).

Reads the bus through core only; imports no role.
"""

from astraflow.sim.errors import ReplayError
from astraflow.sim.simulate import Comparison, Result, SimConfig, compare, simulate, tail_share
from astraflow.sim.workload import Episode, Group, Segment, Workload, synthetic

__all__ = [
    "Comparison", "Episode", "Group", "ReplayError", "Result", "Segment", "SimConfig",
    "Workload", "compare", "simulate", "synthetic", "tail_share",
]
