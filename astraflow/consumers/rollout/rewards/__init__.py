"""Rewards: ``fn(completion, reference, **kwargs) -> float | {"reward": float, ...}``.

Registered by name (``exact_match``, ``numeric_match``, ``math``, ``code``, ``reasoning_gym``) or
loaded from a user's ``module.path:function``. :func:`score` runs one under a timeout and never
raises: a reward that crashes or times out scores 0 and says so (``Score.failed``), which the
worker counts (``reward_failures``). ``rollout.reward.extract`` names an answer extractor
(:data:`EXTRACTORS`) applied to the completion before the reward sees it.

Modules:

- :mod:`.base`: The reward registry and the fault-isolating :func:`score`.
- :mod:`.basic`: Exact-match and numeric-match rewards against ``reference["answer"]``.
- :mod:`.code`: The ``code`` reward: run the completion's program against the task's tests in the
  sandbox.
- :mod:`.extract`: Answer extraction: ``rollout.reward.extract`` names a function ``text -> text``
  applied to the completion before the reward sees it.
- :mod:`.mathverify`: Math answers checked with the ``math-verify`` package (LaTeX/boxed/plain
  expressions).
- :mod:`.reasoning_gym`: The ``reasoning_gym`` reward: a completion scored by its reasoning-gym
  dataset's own ``score_answer(answer, entry)``.
- :mod:`.sandbox`: Run untrusted Python in a contained subprocess (the ``code`` reward, the
  ``python`` tool).
- :mod:`.sandbox_launch`: The code sandbox's launcher: ``python -I -S sandbox_launch.py
  CONFIG_JSON``.
- :mod:`.sandbox_probe`: What the code sandbox can use on this host, found by trying it, and the
  one way it starts a sandboxed program.
- :mod:`.sandbox_seccomp`: The code sandbox's seccomp filter, as classic BPF (no libseccomp
  needed).
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
