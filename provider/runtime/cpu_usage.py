"""A function's CPU in FunctionUsage's unit: millicores, "the increase in CPU usage since the last
measurement" (OpenFaaS's `usage.cpu`, Kubernetes' millicores), from each replica's cumulative CPU.

Each replica is tracked apart (by its id), so a replica replaced between two reads is neither a
negative step nor a spike: its successor starts its own count. A replica's first reading has no
previous one; it reports its average since it started, not 0, since `faas-cli describe` is most
often asked once.
"""

from __future__ import annotations

import threading


class CpuRate:
    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}  # replica -> (time, cumulative CPU seconds)
        self._lock = threading.Lock()

    def millicores(self, readings: dict[str, tuple[float, float, float]]) -> float:
        """readings: replica -> (now, its cumulative CPU seconds, when it started), all on one
        clock; the replicas not read this time are forgotten."""
        total = 0.0
        with self._lock:
            for replica, (now, cpu_s, started) in readings.items():
                last_t, last_cpu = self._last.get(replica, (started, 0.0))
                if cpu_s < last_cpu:  # its counter restarted (the same name, a new process)
                    last_t, last_cpu = started, 0.0
                if now - last_t > 1e-3:
                    total += max(0.0, cpu_s - last_cpu) / (now - last_t) * 1000.0
                self._last[replica] = (now, cpu_s)
            for gone in set(self._last) - set(readings):
                del self._last[gone]
        return total


def container_cpu_seconds(stats: dict) -> float:
    """A container's cumulative CPU from the Engine API's stats (`cpu_stats.cpu_usage.total_usage`, ns)."""
    usage = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    return int(usage.get("total_usage") or 0) / 1e9
