"""reasoning-gym task suites (``source: reasoning_gym``): seeded procedural problems, scored by
the dataset's own ``score_answer`` (the rollout reward ``reasoning_gym``).

Each split is generated from its own seed (``seed`` / ``test_seed``) and filtered by a hash of
the question text (``test_fraction`` held out), so no question is ever in both splits. A
task's id is ``<dataset name>/<hash of the question>``; its reference carries the oracle
``answer`` and what the reward needs to regenerate the item exactly (``rg_dataset``,
``rg_config``, ``rg_entry``, ``rg_seed``, ``rg_size``, ``rg_index``).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from astraflow.core.records import ChatMessage
from astraflow.producers.arithmetic import split_of
from astraflow.producers.sources import SourceError, TaskSpec

log = logging.getLogger("astraflow.producer")

#: items generated per item wanted, at most, before a split is declared too small
MAX_SCAN = 50
_INT_RANGE = (-(2**63), 2**64)  # what msgpack holds; larger ints travel as text


def dataset_names() -> list[str]:
    """Every registered reasoning-gym dataset name."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def open_dataset(name: str, config: Mapping[str, Any], *, seed: int, size: int) -> Any:
    """``reasoning_gym.create_dataset(name, seed=, size=, **config)``; an unknown name or a
    config the dataset refuses is a :class:`SourceError` naming the key to fix."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise SourceError("producer.source=reasoning_gym needs reasoning-gym: pip install "
                          "'reasoning-gym>=0.1.25,<0.2'") from None
    if name not in DATASETS:
        names = sorted(DATASETS)
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise SourceError(f"unknown reasoning-gym dataset {name!r} in "
                          f"producer.reasoning_gym.dataset; {hint}valid ({len(names)}): "
                          f"{', '.join(names[:12])}, ... (reasoning_gym.factory.DATASETS)")
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **dict(config))
    except (TypeError, ValueError, AssertionError, KeyError) as e:
        fields = sorted(getattr(DATASETS[name][1], "__dataclass_fields__", {}))
        fields = [f for f in fields if f not in ("seed", "size")]
        raise SourceError(f"producer.reasoning_gym.config {dict(config)!r} is refused by "
                          f"dataset {name!r}: {type(e).__name__}: {e}; its config fields: "
                          f"{', '.join(fields)}") from None


def plain(value: Any) -> Any:
    """``value`` as msgpack/JSON-safe data: tuples and sets become lists (sets sorted), mapping
    keys strings, numpy numbers and arrays Python ones, ints past 64 bits and any other object
    their text."""
    t = type(value)
    if value is None or t in (bool, str, float):
        return value
    if t is int:
        return value if _INT_RANGE[0] <= value < _INT_RANGE[1] else str(value)
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((plain(v) for v in value), key=repr)
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalar or array
        return plain(value.tolist())
    for kind in (bool, int, float, str):  # subclasses (IntEnum, str enums)
        if isinstance(value, kind):
            return plain(kind(value))
    return str(value)


def question_id(question: str) -> str:
    """A stable short id for a question (16 hex digits of its blake2b)."""
    return hashlib.blake2b(question.encode(), digest_size=8).hexdigest()


def items(cfg: Any, split: Literal["train", "test"]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(index, size of the dataset instance, entry) of the split's items, in order: ``size``
    items for train, ``test_size`` distinct questions for test."""
    seed, want = (cfg.seed, cfg.size) if split == "train" else (cfg.test_seed, cfg.test_size)
    share = 1.0 - cfg.test_fraction if split == "train" else cfg.test_fraction
    limit = want * MAX_SCAN + 1000
    # some datasets precompute `size` items or index a list of that length: never read past it
    n = min(limit, math.ceil(want / share * 1.2) + 16)
    start = found = 0
    seen: set[str] = set()
    while True:
        ds = open_dataset(cfg.dataset, cfg.config, seed=seed, size=n)
        for i in range(start, n):
            entry = ds[i]
            question = str(entry["question"])
            if split_of(question, cfg.test_fraction) != split:
                continue
            if split == "test":
                if question in seen:
                    continue
                seen.add(question)
            yield i, n, entry
            found += 1
            if found >= want:
                return
        if n >= limit:
            break
        start, n = n, min(limit, n * 2)
    if split == "test" and found:
        log.warning("reasoning-gym dataset=%s has only %d distinct held-out questions (wanted "
                    "producer.reasoning_gym.test_size=%d) after %d items", cfg.dataset, found,
                    want, n)
        return
    key = "size" if split == "train" else "test_size"
    raise SourceError(f"reasoning-gym dataset {cfg.dataset!r}: only {found} {split} items of "
                      f"producer.reasoning_gym.{key}={want} in {n} generated (the question space "
                      "is too small for the split): lower it, change test_fraction, or widen "
                      "producer.reasoning_gym.config")


def rg_specs(cfg: Any, split: Literal["train", "test"], *,
             dataset: str | None = None) -> Iterator[TaskSpec]:
    """The split's tasks: the question as one user message, the reference for the
    ``reasoning_gym`` reward (and ``answer`` for the plain ones). ``dataset``: the id prefix
    (default ``rg/<name>``)."""
    prefix = dataset or f"rg/{cfg.dataset}"
    seed = cfg.seed if split == "train" else cfg.test_seed
    config = plain(dict(cfg.config))
    for index, size, entry in items(cfg, split):
        question = str(entry["question"])
        reference: dict[str, Any] = {
            "rg_dataset": cfg.dataset, "rg_config": config, "rg_entry": plain(entry),
            "rg_seed": seed, "rg_size": size, "rg_index": index}
        if entry.get("answer") is not None:  # datasets without one oracle answer have None
            reference["answer"] = str(entry["answer"])
        yield TaskSpec(id=f"{prefix}/{question_id(question)}",
                       prompt=[ChatMessage(role="user", content=question)],
                       reference=reference, metadata={"split": split})
