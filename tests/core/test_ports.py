"""Free loopback ports (astraflow/core/ports.py)."""

from __future__ import annotations

import socket

from astraflow.core.ports import free_port, free_ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(0 < p < 65536 for p in ports)
    socks = [socket.socket() for _ in ports]
    try:
        for s, p in zip(socks, ports, strict=True):
            s.bind(("127.0.0.1", p))
    finally:
        for s in socks:
            s.close()


def test_free_port_avoids_the_excluded_one() -> None:
    taken = free_port()
    assert all(free_port(exclude=taken) != taken for _ in range(50))
