"""Data-algorithm policies (docs/policies.md): stream processors between topics.

Three stages, each one process running a chain of pure policies::

    pre_rollout   tasks.raw        -> tasks              gate, greso
    post_rollout  trajectories     -> groups.<policy>    assembler, staleness, dynamic_sampling
    batch         groups.<policy>  -> batches.<policy>   replay, batcher

A policy is a pure function of (record, state, context) → records (see
:mod:`astraflow.policies.base`); :class:`Chain` runs a stage's policies without a bus, and
:func:`run_stage` runs it between topics with checkpointed, exactly-resuming state.
See docs/policies.md.
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
