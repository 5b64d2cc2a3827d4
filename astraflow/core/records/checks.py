"""The values of a trajectory checked against the run's own facts, at the door of every role
that trusts them (the post-rollout stage and the trainer).

Decoding refuses a record of the wrong shape; this refuses well-formed values that would stop
training, such as a token id outside the vocabulary or a NaN reward (the list is in
docs/policies.md). :func:`trajectory_problem` says what is wrong with one, or None;
:func:`checked` raises :class:`~astraflow.core.errors.SchemaError` with that reason or returns
the trajectory, its rewards clipped when :attr:`RecordLimits.beyond_bound` is ``clip``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from astraflow.core.errors import SchemaError
from astraflow.core.records.base import unpack

if TYPE_CHECKING:
    from astraflow.core.records.episodes import Trajectory

#: the default bound on a reward's magnitude: far above any reward a verifier or a shaped
#: reward gives, far below where the advantages' float arithmetic overflows
REWARD_BOUND = 1e6
#: a trained token's behaviour logprob may exceed 0 by float rounding, never by more
LOGPROB_SLACK = 1e-3

BeyondBound = Literal["refuse", "clip"]


@dataclass(frozen=True)
class RecordLimits:
    """The facts a trajectory is checked against: ``vocab`` (policy → vocabulary size; a
    policy absent: its token ids are only checked to be >= 0), the reward bound and what to do
    with a finite reward beyond it."""

    vocab: Mapping[str, int] = field(default_factory=dict)
    reward_bound: float = REWARD_BOUND
    beyond_bound: BeyondBound = "refuse"

    def __post_init__(self) -> None:
        if not (self.reward_bound > 0 and math.isfinite(self.reward_bound)):
            raise ValueError(f"reward_bound must be a positive finite number, got "
                             f"{self.reward_bound!r}")
        if self.beyond_bound not in ("refuse", "clip"):
            raise ValueError(f"beyond_bound must be 'refuse' or 'clip', got "
                             f"{self.beyond_bound!r}")


def _rewards(t: Trajectory) -> list[tuple[str, float]]:
    return ([("reward", t.reward)] + [(f"rewards[{k!r}]", v) for k, v in t.rewards.items()]
            + [(f"turn_rewards[{i}]", v) for i, v in enumerate(t.turn_rewards)])


def _reward_problem(t: Trajectory, limits: RecordLimits) -> str | None:
    for name, value in _rewards(t):
        if not math.isfinite(value):
            return f"{name} is {value!r}: rewards must be finite"
        if abs(value) > limits.reward_bound and limits.beyond_bound == "refuse":
            return (f"{name} is {value!r}, beyond the reward bound {limits.reward_bound:g} "
                    "(data.records.reward_bound; beyond_bound: clip to clip instead)")
    return None


def _arrays_pass(ids: Any, mask: Any, logp: Any, versions: Any, vocab: int | None) -> bool:
    """Whether packed per-token arrays (of one trajectory or of many joined) pass every
    token check, in a few vectorised passes: the common case, an honest record, costs that
    and nothing more (the reason of a failure is found by :func:`_token_reason`)."""
    import numpy as np

    if ids.size == 0:
        return True
    if int(ids.min()) < 0 or (vocab is not None and int(ids.max()) >= vocab):
        return False
    if int(mask.max()) > 1:
        return False
    trained = logp[mask.view(np.bool_)]  # a 0/1 byte is a bool
    # NaN fails the comparison, -inf makes the sum not finite, +inf passes the slack
    if trained.size and not (float(trained.max()) <= LOGPROB_SLACK
                             and math.isfinite(float(trained.sum(dtype=np.float64)))):
        return False
    return int(versions.min()) >= -1  # -1: no policy version sampled it (prompt, demonstration)


def _token_reason(t: Trajectory, limits: RecordLimits) -> str:
    """Why ``t``'s per-token arrays fail :func:`_arrays_pass` (one reason)."""
    import numpy as np

    ids = unpack(t.token_ids, "<i4")
    lo, hi = int(ids.min()), int(ids.max())
    vocab = limits.vocab.get(t.policy)
    if lo < 0:
        return f"token id {lo} is negative"
    if vocab is not None and hi >= vocab:
        return (f"token id {hi} is outside the vocabulary of policy {t.policy!r} "
                f"(ids 0..{vocab - 1})")
    mask = unpack(t.loss_mask, "u1")
    if int(mask.max()) > 1:
        return f"loss_mask holds {int(mask.max())}; entries are 0 or 1"
    logp = unpack(t.logprobs, "<f4")[mask.astype(bool)]
    if not bool(np.isfinite(logp).all()):
        return "a trained token's behaviour logprob is not finite"
    if logp.size and float(logp.max()) > LOGPROB_SLACK:
        return f"a trained token's behaviour logprob is {float(logp.max()):g} > 0"
    return f"a token's version is {int(unpack(t.versions, '<i4').min())}, below -1"


def _shape_problem(t: Trajectory) -> str | None:
    n = len(t.token_ids) // 4
    if t.sample_index < 0 or t.group_size < 0:
        return f"sample_index {t.sample_index} / group_size {t.group_size} is negative"
    if not 0 <= t.prompt_len <= n:
        return f"prompt_len {t.prompt_len} is outside the sequence of {n} tokens"
    for s in t.spans:
        if not 0 <= s.start <= s.end <= n:
            return f"turn span [{s.start}, {s.end}) is outside the sequence of {n} tokens"
    return None


def _arrays(ts: Sequence[Trajectory]) -> tuple[Any, Any, Any, Any]:
    def joined(name: str, dtype: str) -> Any:
        return unpack(b"".join(getattr(t, name) for t in ts), dtype)

    return (joined("token_ids", "<i4"), joined("loss_mask", "u1"), joined("logprobs", "<f4"),
            joined("versions", "<i4"))


def trajectory_problem(t: Trajectory, limits: RecordLimits) -> str | None:
    """What makes ``t`` untrustworthy under ``limits`` (one reason), or None."""
    problem = _shape_problem(t) or _reward_problem(t, limits)
    if problem is not None:
        return problem
    if _arrays_pass(*_arrays([t]), limits.vocab.get(t.policy)):
        return None
    return _token_reason(t, limits)


def problems(ts: Sequence[Trajectory], limits: RecordLimits) -> dict[int, str]:
    """Index -> reason of every trajectory of ``ts`` that :func:`trajectory_problem` refuses.
    The token arrays of each policy's trajectories are checked together first: a batch of
    honest records costs a few vectorised passes, not a few per record."""
    out: dict[int, str] = {}
    by_policy: dict[str, list[int]] = {}
    for i, t in enumerate(ts):
        problem = _shape_problem(t) or _reward_problem(t, limits)
        if problem is not None:
            out[i] = problem
        else:
            by_policy.setdefault(t.policy, []).append(i)
    for policy, idx in by_policy.items():
        if _arrays_pass(*_arrays([ts[i] for i in idx]), limits.vocab.get(policy)):
            continue
        for i in idx:
            problem = trajectory_problem(ts[i], limits)
            if problem is not None:
                out[i] = problem
    return out


def _clip(value: float, bound: float) -> float:
    return max(-bound, min(bound, value))


def checked(t: Trajectory, limits: RecordLimits) -> Trajectory:
    """``t`` when :func:`trajectory_problem` finds nothing, its rewards clipped to the bound
    under ``beyond_bound: clip``; SchemaError naming the trajectory and the reason otherwise."""
    problem = trajectory_problem(t, limits)
    if problem is not None:
        raise SchemaError(f"trajectory {t.id!r} of policy {t.policy!r}: {problem}")
    return clipped(t, limits)


def clipped(t: Trajectory, limits: RecordLimits) -> Trajectory:
    """``t`` (checked already) with its rewards clipped to the bound, in place, under
    ``beyond_bound: clip``; as it is otherwise."""
    if limits.beyond_bound == "clip":
        b = limits.reward_bound
        t.reward = _clip(t.reward, b)
        if t.rewards:
            t.rewards = {k: _clip(v, b) for k, v in t.rewards.items()}
        if t.turn_rewards:
            t.turn_rewards = [_clip(v, b) for v in t.turn_rewards]
    return t


__all__ = ["REWARD_BOUND", "BeyondBound", "RecordLimits", "checked", "clipped", "problems",
           "trajectory_problem"]
