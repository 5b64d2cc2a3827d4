"""Data-algorithm policies (docs/policies.md): stream processors between topics.

Three stages, each one process running a chain of pure policies::

    pre_rollout   tasks.raw        -> tasks              gate, greso
    post_rollout  trajectories     -> groups.<policy>    assembler, staleness, dynamic_sampling
    batch         groups.<policy>  -> batches.<policy>   replay, batcher

A policy is a pure function of (record, state, context) → records (see
:mod:`astraflow.policies.base`); :class:`Chain` runs a stage's policies without a bus, and
:func:`run_stage` runs it between topics with checkpointed, exactly-resuming state.
See docs/policies.md.

Modules:

- :mod:`.assembler`: Group assembler (post-rollout, ``trajectories → groups``).
- :mod:`.base`: What a data-algorithm policy is: a pure function of (record, state, context) →
  records.
- :mod:`.batcher`: Batcher (batch stage, last): batches of B whole groups for one policy.
- :mod:`.chain`: A stage's chain of policies, run in order inside one process, with no bus in
  sight.
- :mod:`.checkpoint`: Stage checkpoints: every policy's state, the input offsets it reflects, and
  the outputs derived from those inputs.
- :mod:`.config`: Config section ``data``: the data-algorithm policies of the three stages
  (docs/policies.md).
- :mod:`.env`: What a policy factory is given, and the reward arithmetic several policies share.
- :mod:`.filters`: Group filters: the staleness filter and DAPO dynamic sampling (``groups →
  groups``).
- :mod:`.gate`: Staleness capacity gate (pre-rollout): the system's backpressure.
- :mod:`.greso`: GRESO selective rollout (pre-rollout, ``tasks.raw → tasks``; arXiv 2506.02177).
- :mod:`.registry`: The registry of policies (name → factory) and ``build_chain``, which turns a
  stage's config into a :class:`~astraflow.policies.chain.Chain`.
- :mod:`.replay`: Replay (batch stage, right before the batcher): a share r of every batch is drawn
  from a bounded buffer of past groups.
- :mod:`.reporter`: The reporter (docs/elastic.md#the-load-report, `astraflow report`).
- :mod:`.routing`: Where a released task goes: the partition of ``tasks`` with the least unfinished
  work.
- :mod:`.runner`: The stage processor: one process running one stage's chain between its topics.
- :mod:`.stage`: ``run_stage``: build a stage from the ``data`` section (plus the run's name,
  policies and seed) and run it on the run's bus.
- :mod:`.trust`: Which trainer versions a stage believes: a weight manifest is followed only when
  it could be the trainer's.
"""

from astraflow.core.registry import lazy_exports
from astraflow.policies.base import Context, GroupRef, Policy, PolicyError, uniform
from astraflow.policies.chain import Chain
from astraflow.policies.config import DataConfig
from astraflow.policies.env import BuildEnv

__all__ = [
    "BuildEnv", "Chain", "Context", "DataConfig", "GroupRef", "Policy", "PolicyError",
    "build_chain", "run_stage", "uniform",
]


# the registry and the runner load the policies: keep them lazy
__getattr__ = lazy_exports(__name__, {"build_chain": "registry", "run_stage": "stage"})
