"""Each function's own uid: what keeps one tenant's replicas from another's files and processes
when the stack runs as root (`replica.ISOLATED_BY_UID`)."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import threading

from faas_gpu.sandbox.primitives import SandboxError

FIRST_UID = 0x70000000
"""The first uid of faas-gpu's replicas (1879048192): above the ranges hosts give users (below
60000), systemd's dynamic users (61184-65519) and systemd-nspawn's container ranges (up to
0x6FFFFFFF), and below 2^31, where some tools take a uid for negative."""
UID_COUNT = 65536
"""How many uids replicas may get (one per function), FIRST_UID up to 0x7000FFFF."""


class UidTable:
    """Each function's own uid, the same across restarts: the first free uid from a hash of the
    function's key (`namespace/name`) on, kept in a JSON file (the state folder's). Free: no other
    function has it, no user of this host has it, and no subordinate-id range (/etc/subuid,
    /etc/subgid: other users' containers) holds it."""

    def __init__(self, path: str | os.PathLike, first: int = FIRST_UID, count: int = UID_COUNT):
        self.path, self.first, self.count = os.fspath(path), first, count
        self._lock = threading.Lock()
        self._table: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._table is None:
            try:
                with open(self.path) as fh:
                    loaded = json.load(fh)
                self._table = {str(k): int(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
            except (OSError, ValueError, TypeError):
                self._table = {}
        return self._table

    def uid(self, key: str) -> int:
        with self._lock:
            table = self._load()
            if key in table:
                return table[key]
            taken = set(table.values())
            reserved = _subordinate_ranges()
            start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % self.count
            for step in range(self.count):
                uid = self.first + (start + step) % self.count
                if uid not in taken and not _is_user(uid) and not any(lo <= uid < hi for lo, hi in reserved):
                    break
            else:
                raise SandboxError(f"no free uid left in {self.first}..{self.first + self.count - 1}")
            table[key] = uid
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(table, fh, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            return uid


def _is_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _subordinate_ranges() -> list[tuple[int, int]]:
    out = []
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                out.append((int(parts[1]), int(parts[1]) + int(parts[2])))
    return out
