"""Rewards: ``fn(completion, reference, **kwargs) -> float | {"reward": float, ...}``.

Registered by name (``exact_match``, ``numeric_match``, ``math``, ``code``, ``reasoning_gym``) or
loaded from a user's ``module.path:function``. :func:`score` runs one under a timeout and never
raises: a reward that crashes or times out scores 0 and says so (``Score.failed``), which the
worker counts (``reward_failures``). ``rollout.reward.extract`` names an answer extractor
(:data:`EXTRACTORS`) applied to the completion before the reward sees it.
"""

from astraflow.consumers.rollout.rewards import (  # noqa: F401  (register)
    basic,
    code,
    mathverify,
    reasoning_gym,
)
from astraflow.consumers.rollout.rewards.base import REWARDS, Score, build_reward, inline, score
from astraflow.consumers.rollout.rewards.extract import EXTRACTORS, with_extract

__all__ = ["EXTRACTORS", "REWARDS", "Score", "build_reward", "inline", "score", "with_extract"]
