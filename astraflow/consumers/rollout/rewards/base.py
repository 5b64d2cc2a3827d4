"""The reward registry and the fault-isolating :func:`score`."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from astraflow.core.registry import Registry

if TYPE_CHECKING:
    from astraflow.consumers.rollout.config import RewardConfig

log = logging.getLogger("astraflow.rollout.reward")

RewardFn = Callable[..., Any]
REWARDS: Registry[RewardFn] = Registry("reward", group="astraflow.rewards")


@dataclass(frozen=True, slots=True)
class Score:
    """A reward value, its named components, and whether computing it failed."""

    value: float
    components: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    error: str | None = None

    def __float__(self) -> float:
        return self.value


def _coerce(out: Any) -> tuple[float, dict[str, float]]:
    if isinstance(out, Score):
        return out.value, dict(out.components)
    if isinstance(out, Mapping):
        comps = {str(k): float(v) for k, v in out.items()}
        if "reward" not in comps:
            raise ValueError(f"a reward returning a mapping must include 'reward'; got "
                             f"{sorted(comps)}")
        return comps.pop("reward"), comps
    if isinstance(out, bool):
        return float(out), {}
    return float(out), {}


def build_reward(config: RewardConfig) -> Callable[[str, Mapping[str, Any]], float]:
    """A plain ``reward(completion, reference) -> float`` from a ``rollout.reward`` section
    (name or module path, kwargs bound, the completion through ``extract`` first), for code
    outside the worker (the evaluator). It raises what the reward raises; use :func:`score` for
    fault isolation and timeouts."""
    from astraflow.consumers.rollout.rewards.extract import with_extract

    fn = with_extract(REWARDS.resolve(config.name), getattr(config, "extract", "none"))
    kwargs = dict(config.kwargs)

    def reward(completion: str, reference: Mapping[str, Any]) -> float:
        out = fn(completion, reference, **kwargs)
        if inspect.isawaitable(out):
            out = asyncio.run(out)  # type: ignore[arg-type]
        return _coerce(out)[0]

    reward.__name__ = getattr(fn, "__name__", config.name)
    return reward


def inline(fn: RewardFn) -> RewardFn:
    """Mark a sync reward as cheap and bounded (string compare, a regex): :func:`score` then
    calls it on the event loop instead of in a thread (no timeout applies)."""
    fn.af_inline = True  # type: ignore[attr-defined]
    return fn


async def score(fn: RewardFn, completion: str, reference: Mapping[str, Any], *,
                timeout: float = 30.0, **kwargs: Any) -> Score:
    """Run reward ``fn`` (sync in a thread, or async) under ``timeout`` seconds. Never raises:
    an exception, a timeout or a non-finite value gives ``Score(0.0, failed=True)``."""
    try:
        if getattr(fn, "af_inline", False):
            out = fn(completion, reference, **kwargs)
        elif inspect.iscoroutinefunction(fn):
            out = await asyncio.wait_for(fn(completion, reference, **kwargs), timeout)
        else:
            out = await asyncio.wait_for(
                asyncio.to_thread(fn, completion, reference, **kwargs), timeout)
        value, comps = _coerce(out)
        if not math.isfinite(value):
            raise ValueError(f"reward is {value}")
        return Score(value, comps)
    except TimeoutError:
        err = f"reward timed out after {timeout:g} s"
    except Exception as e:  # noqa: BLE001 - a reward's failure scores 0 and is counted
        err = f"{type(e).__name__}: {e}"
    log.warning("reward failed (scored 0) reward=%s error=%s",
                getattr(fn, "__name__", fn), err)
    return Score(0.0, {"reward_failed": 1.0}, True, err)
