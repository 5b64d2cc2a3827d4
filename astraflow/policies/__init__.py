"""Data-algorithm policies (docs/policies.md): stream processors between topics.

Three stages, each one process running a chain of pure policies::

    pre_rollout   tasks.raw        -> tasks              gate, greso
    post_rollout  trajectories     -> groups.<policy>    assembler, staleness, dynamic_sampling
    batch         groups.<policy>  -> batches.<policy>   replay, batcher

A policy is a pure function of (record, state, context) → records (:mod:`astraflow.policies.base`);
:class:`Chain` runs a stage's policies without a bus, and :func:`run_stage` runs it between
topics with checkpointed, exactly-resuming state.

Modules:

- :mod:`.assembler`: group assembler (``trajectories → groups``).
- :mod:`.base`: what a policy is: the contract and shared helpers.
- :mod:`.batcher`: batches of B whole groups for one policy.
- :mod:`.chain`: a stage's policies, run in order without a bus.
- :mod:`.checkpoint`: stage checkpoints: state, input offsets, pending outputs.
- :mod:`.config`: config section ``data``.
- :mod:`.env`: what a policy factory is given; shared reward arithmetic.
- :mod:`.filters`: the staleness filter and DAPO dynamic sampling.
- :mod:`.gate`: the staleness capacity gate: the system's backpressure.
- :mod:`.greso`: GRESO selective rollout (arXiv 2506.02177).
- :mod:`.registry`: policy names → factories, and ``build_chain``.
- :mod:`.replay`: replay: a share of every batch from past groups.
- :mod:`.reporter`: the load report (``astraflow report``).
- :mod:`.routing`: where a released task goes: the least-backlogged partition.
- :mod:`.runner`: the stage processor: one stage's chain between its topics.
- :mod:`.stage`: ``run_stage``: a stage built from the config, run on the bus.
- :mod:`.trust`: which trainer versions a stage believes.
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
