"""Rewards: ``fn(completion, reference, **kwargs) -> float | {"reward": float, ...}``.

Registered by name (``exact_match``, ``numeric_match``, ``math``, ``code``, ``reasoning_gym``) or
loaded from a user's ``module.path:function``. :func:`score` runs one under a timeout and never
raises: a reward that crashes or times out scores 0 and says so (``Score.failed``).
``rollout.reward.extract`` names an answer extractor (:data:`EXTRACTORS`) applied first.

Modules:

- :mod:`.base`: the reward registry and the fault-isolating :func:`score`.
- :mod:`.basic`: exact-match and numeric-match rewards.
- :mod:`.code`: the ``code`` reward: the completion's program against the task's tests.
- :mod:`.extract`: answer extractors (``rollout.reward.extract``).
- :mod:`.mathverify`: math answers checked with ``math-verify``.
- :mod:`.reasoning_gym`: the ``reasoning_gym`` reward: the dataset's own scorer.
- :mod:`.sandbox`: run untrusted Python in a contained subprocess.
- :mod:`.sandbox_launch`: the sandbox's launcher (standard library only).
- :mod:`.sandbox_probe`: what the sandbox can use on this host, and how it starts a program.
- :mod:`.sandbox_seccomp`: the sandbox's seccomp filter.
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
