"""The ``reasoning_gym`` reward: a completion scored by its reasoning-gym dataset's own
``score_answer(answer, entry)`` (tasks of ``producer.source: reasoning_gym``).

The reference names the dataset (``rg_dataset``), its config (``rg_config``) and the item
(``rg_entry``, made JSON-safe). A few scorers compare tuples, which JSON cannot hold, so where
the reference also says where the item came from (``rg_seed``, ``rg_size``, ``rg_index``) the
item is regenerated exactly, once per task, and used when its question is the reference's.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.rewards.base import REWARDS

log = logging.getLogger("astraflow.rollout.reward")

_lock = threading.Lock()  # dataset construction and item generation may touch shared state
_SOURCE = ("rg_seed", "rg_size", "rg_index")


@functools.lru_cache(maxsize=32)
def _dataset(name: str, config: str, seed: int | None, size: int | None) -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("the reasoning_gym reward needs reasoning-gym: pip install "
                          "'reasoning-gym>=0.1.25,<0.2'") from None
    kwargs: dict[str, Any] = json.loads(config)
    if seed is not None:
        kwargs["seed"] = seed
    if size is not None:
        kwargs["size"] = size
    try:
        return reasoning_gym.create_dataset(name, **kwargs)
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"reasoning-gym dataset {name!r} with config {config} cannot be "
                         f"built ({type(e).__name__}: {e}); the task's reference names it in "
                         "rg_dataset / rg_config") from None


@functools.lru_cache(maxsize=4096)
def _entry(name: str, config: str, seed: int, size: int, index: int) -> dict[str, Any]:
    return _dataset(name, config, seed, size)[index]


def scorer(name: str, config: Mapping[str, Any] | None = None, *, seed: int | None = None,
           size: int | None = None) -> Any:
    """The (cached) dataset instance whose ``score_answer`` scores ``name`` with ``config``."""
    key = json.dumps(dict(config or {}), sort_keys=True)
    with _lock:
        return _dataset(name, key, seed, size)


def entry_of(reference: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(dataset instance, entry) to score a completion of the task with ``reference``."""
    name = reference.get("rg_dataset")
    if not isinstance(name, str) or not name:
        raise ValueError("the reasoning_gym reward needs the reference's 'rg_dataset' (it has "
                         f"{sorted(reference)}): score tasks of producer.source=reasoning_gym "
                         "with it, or pick another rollout.reward.name")
    entry = reference.get("rg_entry")
    if not isinstance(entry, Mapping):
        raise ValueError(f"the reasoning_gym reward needs the reference's 'rg_entry' (the "
                         f"dataset item); the reference has {sorted(reference)}")
    config = reference.get("rg_config") or {}
    if all(isinstance(reference.get(k), int) for k in _SOURCE):
        seed, size, index = (int(reference[k]) for k in _SOURCE)
        key = json.dumps(dict(config), sort_keys=True)
        with _lock:
            ds = _dataset(name, key, seed, size)
            original = _entry(name, key, seed, size, index)
        if str(original.get("question")) == str(entry.get("question")):
            return ds, original
        log.warning("reasoning-gym dataset=%s item %d regenerates another question (another "
                    "reasoning-gym version?); scoring the reference's entry", name, index)
        return ds, dict(entry)
    return scorer(name, config), dict(entry)


@REWARDS.register("reasoning_gym")
def reasoning_gym(completion: str, reference: Mapping[str, Any]) -> float:
    """The dataset's own ``score_answer(completion, entry)`` (0..1; some datasets give partial
    credit). A completion the dataset's parser refuses (ValueError) scores 0."""
    ds, entry = entry_of(reference)
    try:
        return float(ds.score_answer(completion, entry))
    except ValueError:  # e.g. prime_factorization's int() of a word: a wrong answer
        return 0.0
