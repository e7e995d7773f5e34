"""Free loopback ports for the servers a process starts and hands a port to (replicas, daemons, test
servers).

Why not `bind(port 0)`: the kernel answers port 0 from its ephemeral range, the same range it draws
the local end of every outgoing connection from. A port found free, closed and handed to a child to
listen on can meanwhile become the local end of some process's outgoing connection (a kept-alive
client of etcd, a gateway calling a replica), and the child's listen fails with EADDRINUSE for as
long as that connection lives (CI on 2026-12-02: the stack's gunicorn could not bind 45007 for
five seconds). Below the ephemeral range a port is only ever taken by an explicit bind, so we draw
there, at random (several processes draw at once), and keep the ports this process handed out
lately off its next draws.
"""

from __future__ import annotations

import collections
import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT = (32768, 60999)
POOL_SIZE = 16384
"""How many ports below (or above) the ephemeral range to draw from."""
MIN_POOL = 1024
"""Narrower than this (an ephemeral range that spans nearly everything), fall back to port 0."""
RECENT = 1024
"""How many handed-out ports to keep off the next draws: a caller may not have bound one yet."""

_rng = random.SystemRandom()
_lock = threading.Lock()
_recent: collections.deque[int] = collections.deque(maxlen=RECENT)


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT
    return low, high


def pool(low: int, high: int) -> range | None:
    """The ports outside the ephemeral range [low, high] to draw from: below it when there is room
    (the usual Linux layout), else above it; None when neither side has MIN_POOL ports."""
    below = range(max(1024, low - POOL_SIZE), low)
    above = range(high + 1, min(65536, high + 1 + POOL_SIZE))
    best = max(below, above, key=len)
    return best if len(best) >= MIN_POOL else None


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on or is connected from now, outside the ephemeral range."""
    ports = pool(*ephemeral_range())
    if ports is not None:
        with _lock:
            for _ in range(256):
                port = _rng.choice(ports)
                if port not in _recent and _bindable(port, host):
                    _recent.append(port)
                    return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
