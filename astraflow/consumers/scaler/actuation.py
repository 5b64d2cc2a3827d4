"""What an actuator is (:class:`Actuator`) and what one action did (:class:`Actuation`).

Its own module so that the backends (:mod:`.command`, :mod:`.local`) and the factory
(:mod:`.actuators`) import it without importing one another.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Actuation:
    """The outcome of one :meth:`Actuator.scale` call. Written by the actuator, read by the
    scaler (logged, and put on its metrics)."""

    ok: bool  # the pool was asked for ``target`` and the backend accepted it
    target: int  # the size asked for
    previous: int  # the size before: the actuator's own count, else the caller's ``current``
    attempts: int  # calls made (1 + retries used); 0: nothing needed doing
    error: str = ""  # the last failure (stderr tail, exit status, exception); "" if none failed
    duration_s: float = 0.0  # wall time of the whole call, backoff sleeps included

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Actuator(Protocol):
    """Changes the number of rollout processes of one pool (docs/elastic.md#actuators).

    Built by :func:`~astraflow.consumers.scaler.actuators.build_actuator` from the pool's
    ``actuator`` config, by ``type``.
    """

    def count(self) -> int | None:
        """The pool's current size as the actuator knows it; None: unknown (the scaler then
        uses the LoadReport's count of live workers)."""
        ...

    def scale(self, target: int, current: int) -> Actuation:
        """Ask for ``target`` processes (``current``: the scaler's view of the size now).
        Never raises for an operational failure (a command that fails, a process that cannot
        start): the returned :class:`Actuation` says what happened."""
        ...

    def close(self) -> None:
        """Release what the actuator holds (a local one stops the processes it started:
        SIGTERM, then SIGKILL after its grace period)."""
        ...
