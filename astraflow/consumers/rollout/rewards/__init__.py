"""Rewards: ``fn(completion, reference, **kwargs) -> float | {"reward": float, ...}``.

Registered by name (``exact_match``, ``numeric_match``, ``math``, ``code``) or loaded from a
user's ``module.path:function``. :func:`score` runs one under a timeout and never raises: a
reward that crashes or times out scores 0 and says so (``Score.failed``), which the worker
counts (``reward_failures``).
"""

from astraflow.consumers.rollout.rewards import basic, code, mathverify  # noqa: F401  (register)
from astraflow.consumers.rollout.rewards.base import REWARDS, Score, build_reward, inline, score

__all__ = ["REWARDS", "Score", "build_reward", "inline", "score"]
