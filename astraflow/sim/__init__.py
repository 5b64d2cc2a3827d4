"""Replay a workload through a simulated engine and trainer (``astraflow bench replay``).

A workload recorded on GPUs (a run directory's trajectories: generated tokens per turn and the
waits between turns) or drawn from a distribution is run through a discrete-event model of a
continuously batching engine and a trainer, once synchronously and once asynchronously, to
compare trainer wait, effective samples/s and the tail of episode times (docs/replay.md).

Reads the bus through core only; imports no role.

Modules:

- :mod:`.errors`: The replay's error.
- :mod:`.events`: The clock of every discrete-event model here: a heap of timed callbacks.
- :mod:`.recorded`: A workload from a run directory made by ``astraflow run``: its trajectories'
  turns and timings.
- :mod:`.simulate`: A discrete-event simulation of rollout feeding a trainer, on the event clock of
  :mod:`astraflow.sim.events`.
- :mod:`.workload`: What a replay runs: episodes as (decode tokens, wait seconds) segments, in task
  groups.
"""

from astraflow.sim.errors import ReplayError
from astraflow.sim.simulate import Comparison, Result, SimConfig, compare, simulate, tail_share
from astraflow.sim.workload import Episode, Group, Segment, Workload, synthetic

__all__ = [
    "Comparison", "Episode", "Group", "ReplayError", "Result", "Segment", "SimConfig",
    "Workload", "compare", "simulate", "synthetic", "tail_share",
]
