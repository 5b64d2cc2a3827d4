"""A least-recently-used cache bounded by the bytes it holds (and by entries), safe to share
between threads: the gateway's rendered chat templates (filled from the tokenizer threads) and
the responses kept for ``Idempotency-Key`` retries of calls without a session.

Entries are put by whoever accepted the work they cache, never on a lookup: a request that is
refused (too long for the context, malformed) leaves nothing behind. An entry larger than the
whole bound is not kept at all.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(frozen=True)
class CacheSize:
    """What a :class:`SizedCache` holds now: ``entries`` and their ``bytes`` (as measured by
    its ``size`` function), against its bounds."""

    entries: int
    bytes: int
    max_entries: int
    max_bytes: int


class SizedCache(Generic[V]):
    """key -> value, least recently used first out, holding at most ``max_bytes`` (each entry
    weighs ``size(value)`` plus :data:`ENTRY_OVERHEAD`) and ``max_entries`` entries; a bound of
    0 keeps nothing."""

    ENTRY_OVERHEAD = 128  # bytes: the key, the dict slot and the value's object headers

    def __init__(self, max_bytes: int, size: Callable[[V], int], *,
                 max_entries: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._size = size
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V) -> None:
        weight = self._size(value) + self.ENTRY_OVERHEAD
        if weight > self.max_bytes or self.max_entries <= 0:
            return  # larger than the whole cache: caching it would evict everything else
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, weight)
            self._bytes += weight
            while self._bytes > self.max_bytes or len(self._items) > self.max_entries:
                _, (_, w) = self._items.popitem(last=False)
                self._bytes -= w

    def size(self) -> CacheSize:
        with self._lock:
            return CacheSize(len(self._items), self._bytes, self.max_entries, self.max_bytes)

    def __len__(self) -> int:
        return len(self._items)


def array_bytes(values: array[int]) -> int:
    """What an array of numbers weighs (a cached rendering: token ids, 4 bytes each)."""
    return values.itemsize * len(values)
