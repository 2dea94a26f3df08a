"""Free loopback ports for the servers a test starts, from a range nothing else draws from.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from its ephemeral range, which
every outgoing connection and every Ray component that asks for "any port" draws from too: in the
seconds between the probe and the server's own bind (``canopy up`` starts PostgreSQL and Ray before
its dashboard binds), another process can take it. Ports between Ray's worker ports and the
ephemeral range are only ever handed out here, and each xdist worker hands out a slice of its own.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator

_LOW = 20_000  # Ray's worker processes listen on 10002-19999 (its min/max_worker_port defaults)
_SLICES = 8  # xdist workers; more than this share slices, still probed


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        return int(ports.read().split()[0])


def _candidates() -> Iterator[int]:
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (_ephemeral_low() - _LOW) // _SLICES
    start = _LOW + worker % _SLICES * size
    # Start where this process's id points, so a rerun does not meet its last run's TIME_WAIT ports.
    offset = os.getpid() % size
    return itertools.cycle([*range(start + offset, start + size), *range(start, start + offset)])


_ports = _candidates()


def free_port() -> int:
    """A loopback port no socket is bound to (a TIME_WAIT one counts as bound)."""
    while True:
        port = next(_ports)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
