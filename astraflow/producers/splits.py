"""Train and held-out (test) splits of every task source, disjoint by construction.

``arithmetic`` and ``reasoning_gym`` split by a hash of the problem; ``jsonl`` / ``parquet``
take ``producer.test_path`` (training leaves out every row whose prompt is also there), else
``producer.test_fraction`` of the rows by a hash of the prompt; ``hf_datasets`` takes the
dataset's ``test_split`` the same way. :func:`split_specs` is one pass over a split; the
producer releases the train split, the evaluators measure on :func:`held_out_specs`.
See docs/tasks.md.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from astraflow.core.paths import expand
from astraflow.producers.arithmetic import arithmetic, split_of
from astraflow.producers.sources import SourceError, TaskSpec, read_jsonl, read_parquet

if TYPE_CHECKING:
    from astraflow.producers.config import ProducerConfig

log = logging.getLogger("astraflow.producer")

Split = Literal["train", "test"]
Specs = Callable[[], Iterator[TaskSpec]]


def task_name(pc: ProducerConfig) -> str:
    """A short name of the task for metrics and logs: ``producer.dataset`` when set, else
    ``arith``, ``rg/<dataset>``, or the (first) file's or folder's stem."""
    if pc.dataset:
        return pc.dataset
    if pc.source == "arithmetic":
        return "arith"
    if pc.source == "reasoning_gym":
        return f"rg/{pc.reasoning_gym.dataset}"
    if pc.source == "hf_datasets":
        from astraflow.producers.hf_datasets import source_label

        return source_label(pc.hf_datasets)
    return Path(pc.path[0]).stem if pc.path else pc.source


def prompt_text(spec: TaskSpec) -> str:
    """What the content split hashes: every message of the prompt, with its role."""
    return "\n".join(f"{m.role}: {m.content}" for m in spec.prompt)


def _digest(spec: TaskSpec) -> bytes:
    return hashlib.blake2b(prompt_text(spec).encode(), digest_size=16).digest()


def _distinct(specs: Iterator[TaskSpec]) -> Iterator[TaskSpec]:
    """``specs`` without a prompt seen before: a held-out question counts once in an
    evaluation however often its file repeats it."""
    seen: set[bytes] = set()
    for spec in specs:
        d = _digest(spec)
        if d not in seen:
            seen.add(d)
            yield spec


def held_apart(train: Specs, test: Specs | None, split: Split, *, fraction: float,
               missing: str) -> Iterator[TaskSpec]:
    """The ``split`` of a row source: ``test`` rows and ``train`` rows whose prompt is not
    among them; without ``test``, ``fraction`` of ``train`` by a hash of the prompt; without
    either, every row trains and asking for test raises ``missing``."""
    if test is not None:
        if split == "test":
            yield from _distinct(test())
            return
        held = {_digest(s) for s in test()}
        dropped = 0
        for spec in train():
            if _digest(spec) in held:
                dropped += 1
                continue
            yield spec
        if dropped:
            log.info("left out of training: %d rows whose prompt is in the held-out split",
                     dropped)
        return
    if fraction > 0:
        chosen = (s for s in train() if split_of(prompt_text(s), fraction) == split)
        yield from (_distinct(chosen) if split == "test" else chosen)
        return
    if split == "test":
        raise SourceError(missing)
    yield from train()


def _files(pc: ProducerConfig, split: Split, out: str | Path) -> Iterator[TaskSpec]:
    reader = read_jsonl if pc.source == "jsonl" else read_parquet

    def read(paths: list[str]) -> Specs:
        def specs() -> Iterator[TaskSpec]:
            for raw in paths:
                path = Path(expand(raw, out=out))
                yield from reader(path, dataset=pc.dataset or path.stem, fields=pc.fields)
        return specs

    if not pc.path and not (split == "test" and pc.test_path):
        raise SourceError(f"producer.source={pc.source!r} needs producer.path (one or more "
                          "files)")
    yield from held_apart(
        read(pc.path), read(pc.test_path) if pc.test_path else None, split,
        fraction=pc.test_fraction,
        missing=f"producer.source={pc.source!r} has no held-out split: set producer.test_path "
                "(held-out files) or producer.test_fraction (e.g. 0.05, a share of the rows "
                "by a hash of the prompt)")


def _hf(pc: ProducerConfig, split: Split, out: str | Path) -> Iterator[TaskSpec]:
    from astraflow.producers.hf_datasets import load_splits, rows

    hc = pc.hf_datasets
    loaded = load_splits(hc, out)
    name = task_name(pc)
    if hc.split not in loaded:
        raise SourceError(f"producer.hf_datasets.split: the dataset has no split {hc.split!r}; "
                          f"it has: {', '.join(loaded)}")

    def read(which: str) -> Specs:
        return lambda: rows(loaded[which], label=f"{name}[{which}]", dataset=f"{name}/{which}",
                            fields=pc.fields)

    has_test = hc.test_split is not None and hc.test_split in loaded
    test_split = hc.test_split if has_test else None
    yield from held_apart(
        read(hc.split), read(test_split) if test_split else None, split,
        fraction=pc.test_fraction,
        missing=f"producer.hf_datasets.test_split: the dataset has no split {hc.test_split!r} "
                f"(it has: {', '.join(loaded)}) and producer.test_fraction is 0: name a split "
                f"that exists, or set producer.test_fraction (e.g. 0.05) to hold out a share of "
                f"{hc.split!r}")


def split_specs(pc: ProducerConfig, split: Split, out: str | Path = ".") -> Iterator[TaskSpec]:
    """One pass over the source's ``split``: ``train`` is what the producer releases, ``test``
    the held-out problems. Disjoint by construction for every source. Prompts are the source's
    (the producer puts ``system_prompt`` before them)."""
    if split not in ("train", "test"):
        raise SourceError(f"unknown split {split!r}; valid: train, test")
    if pc.source == "arithmetic":
        update: dict[str, object] = {"split": split}
        if split == "test":
            update["count"] = None  # the whole held-out split, once
        cfg = pc.arithmetic.model_copy(update=update)
        for spec, _repeat in arithmetic(cfg, dataset=pc.dataset or "arith"):
            yield spec
    elif pc.source == "reasoning_gym":
        from astraflow.producers.reasoning_gym import rg_specs

        yield from rg_specs(pc.reasoning_gym, split, dataset=pc.dataset)
    elif pc.source == "hf_datasets":
        yield from _hf(pc, split, out)
    else:
        yield from _files(pc, split, out)


def held_out_specs(pc: ProducerConfig, limit: int, out: str | Path = ".") -> list[TaskSpec]:
    """The first ``limit`` held-out problems (the source's prompts, without
    ``producer.system_prompt``, like :func:`split_specs`). A source without held-out problems
    is a :class:`SourceError` naming the key that gives it some."""
    if limit < 1:
        raise SourceError(f"held-out problems: limit must be >= 1 (got {limit})")
    specs = list(itertools.islice(split_specs(pc, "test", out), limit))
    if not specs:
        key = {"arithmetic": "producer.arithmetic.test_fraction",
               "reasoning_gym": "producer.reasoning_gym.test_size",
               "hf_datasets": "producer.hf_datasets.test_split or producer.test_fraction"}.get(
            pc.source, "producer.test_path or producer.test_fraction")
        raise SourceError(f"the held-out split of producer.source={pc.source!r} is empty: "
                          f"check {key}")
    return specs
