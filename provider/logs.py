"""Function logs: one NDJSON file per function, written by the runtime, read by /system/logs."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

MAX_LOG_BYTES = 16 * 1024 * 1024
"""A function's log rolls over to `<name>.log.1` past this size."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class LogStore:
    def __init__(self, root: Path):
        self.root = root
        self._locks: dict[Path, threading.Lock] = {}
        self._guard = threading.Lock()

    def _path(self, namespace: str, name: str) -> Path:
        return self.root / namespace / f"{name}.log"

    def _lock(self, path: Path) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(path, threading.Lock())

    def append(self, namespace: str, name: str, instance: str, text: str) -> None:
        path = self._path(namespace, name)
        line = json.dumps({"instance": instance, "timestamp": _now(), "text": text}) + "\n"
        with self._lock(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size > MAX_LOG_BYTES:
                path.replace(path.with_suffix(".log.1"))
            with path.open("a", encoding="utf-8") as fh:
                fh.write(line)

    def remove(self, namespace: str, name: str) -> None:
        for p in (self._path(namespace, name), self._path(namespace, name).with_suffix(".log.1")):
            p.unlink(missing_ok=True)

    def _messages(self, namespace: str, name: str, line: str) -> dict | None:
        try:
            entry = json.loads(line)
        except ValueError:
            return None
        return {"name": name, "namespace": namespace, **entry}

    def read(
        self,
        namespace: str,
        name: str,
        *,
        instance: str | None = None,
        tail: int = 0,
        since: datetime | None = None,
        follow: bool = False,
        poll_s: float = 0.2,
        stop: threading.Event | None = None,
    ) -> Iterator[dict]:
        """Log messages (name, namespace, instance, timestamp, text); tail<=0 means all."""

        def keep(msg: dict | None) -> bool:
            if msg is None or (instance and msg.get("instance") != instance):
                return False
            return since is None or parse_time(msg["timestamp"]) >= since

        path = self._path(namespace, name)
        backlog: deque[dict] = deque(maxlen=tail if tail > 0 else None)
        offset = 0
        if path.exists():
            with path.open("r", encoding="utf-8") as fh:
                for line in fh:
                    msg = self._messages(namespace, name, line)
                    if keep(msg):
                        backlog.append(msg)
                offset = fh.tell()
        yield from backlog
        while follow and not (stop and stop.is_set()):
            time.sleep(poll_s)
            if not path.exists():
                continue
            if path.stat().st_size < offset:  # rolled over
                offset = 0
            with path.open("r", encoding="utf-8") as fh:
                fh.seek(offset)
                while True:
                    line = fh.readline()
                    if not line.endswith("\n"):
                        break
                    offset = fh.tell()
                    msg = self._messages(namespace, name, line)
                    if keep(msg):
                        yield msg
