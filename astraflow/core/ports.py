"""Free TCP ports on the loopback interface, for the processes this project starts locally
(a Kafka broker, a Toxiproxy proxy, a gateway under test)."""

from __future__ import annotations

import socket


def free_ports(n: int = 1, *, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that were free on ``host`` when asked (bound together, so no two
    are the same; another process may still take one before the caller binds it)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(*, exclude: int | None = None, host: str = "127.0.0.1") -> int:
    """One free port on ``host``, other than ``exclude``."""
    return next(p for p in free_ports(2, host=host) if p != exclude)
