"""`--pin-cpus`: the gateway and each local replica kept on CPUs of their own.

Why: the gateway and a replica's watchdog are one Python interpreter each. Their threads take
turns on one interpreter lock, so such a process runs Python on one CPU at a time whatever it is
allowed. Left to float, its threads spread over the CPUs and every hand-off of the lock wakes a
thread on another CPU. On the 2-vCPU host of docs/EXPERIMENTS.md (session 37), a cross-CPU
wake-up cost ~17 µs more CPU on each side than a same-CPU one, and the gateway and the watchdog
each handed their lock over ~6 times a request at 8 clients. With both kept on one CPU, the
classify path at batch 8 spent 0.26 ms less CPU a request at 8 clients (1.95 against 2.20, lower
in all 8 rounds of an A/B, session 38) and kept its throughput at 32.

What is pinned, and to how many CPUs:
- the gateway: one CPU, the first of the list;
- a replica: as many CPUs as its instance was given torch threads (`FAAS_GPU_CPU_THREADS`, set by
  the INFless and HarmonyBatch autoscalers), else one. A handler computing on the CPU outside the
  lock is confined with it, so this is for nodes whose models run in the GPU Manager.

The GPU Manager and its workers are never pinned: a worker's torch threads run outside the lock.
Each pin goes to the CPUs of the list holding the fewest pins, so replicas spread as they come
and go. Off by default, as nginx's `worker_cpu_affinity` is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["CpuPins", "parse_cpu_list", "pin_tree"]


def parse_cpu_list(text: str, field: str = "--pin-cpus") -> tuple[int, ...]:
    """A Linux CPU list ("0", "0-3,6", as `taskset -c` and cpusets write them), each CPU once, in
    order; ValueError naming `field` for anything else, or for a CPU this process may not use."""
    cpus: list[int] = []
    for item in text.split(","):
        item = item.strip()
        first, dash, last = item.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise ValueError(f"{field}: expected a CPU list such as 0 or 0-3,6, got {text!r}") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"{field}: {item!r} is not a CPU range")
        cpus += [c for c in range(lo, hi + 1) if c not in cpus]
    allowed = os.sched_getaffinity(0)
    outside = [c for c in cpus if c not in allowed]
    if outside:
        raise ValueError(f"{field}: CPU {outside[0]} is not one this process may run on ({_format(allowed)})")
    return tuple(cpus)


def _format(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


class CpuPins:
    """Which CPUs of the list hold how many pins; `take` gives the least held (ties: list order)."""

    def __init__(self, cpus: Sequence[int]):
        if not cpus:
            raise ValueError("CpuPins: no CPUs")
        self.cpus = tuple(cpus)
        self._held = dict.fromkeys(self.cpus, 0)
        self._lock = threading.Lock()

    def take(self, n: int = 1) -> frozenset[int]:
        """`n` CPUs (at most all of them), each now holding one pin more."""
        with self._lock:
            order = sorted(self.cpus, key=lambda c: (self._held[c], self.cpus.index(c)))
            chosen = order[: max(1, min(n, len(order)))]
            for c in chosen:
                self._held[c] += 1
            return frozenset(chosen)

    def give(self, cpus: Iterable[int]) -> None:
        with self._lock:
            for c in cpus:
                if self._held.get(c, 0) > 0:
                    self._held[c] -= 1

    def held(self) -> dict[int, int]:
        with self._lock:
            return dict(self._held)


def pin_tree(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of `pid` and of the processes under it on `cpus`. Threads and processes
    started afterwards inherit it from their creator; one that ended meanwhile is skipped."""
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:  # gone since the listing
                pass
            try:
                frontier += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except OSError:
                pass
