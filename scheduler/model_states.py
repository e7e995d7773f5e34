"""Where each model's cold start stands, for `/v1/status`: uploading (bytes so far), uploaded,
copying to a GPU Manager, loaded on a unit (and how long the load took).

Why the scheduler keeps it: the upload and the load happen between daemons (the function's
GPU client, the scheduler, the GPU Managers), never in front of a user; the CLI's progress
line (`faas_gpu.cli.progress`) and the status page read it from here, through the gateway's
status JSON. A load in progress is the GPU Manager's own unit report (`running` a model not yet
in `models`); this says what the scheduler alone sees.

Recorded only on a cold start (an upload, a copy to a manager, a job answered as a cache miss):
a job that hits a loaded model records nothing. Bounded: the last `KEEP` models.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, BinaryIO

KEEP = 64
"""Models remembered (the newest), and uploads in flight shown at most."""


class ModelStates:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        """`clock`: the scheduler's (durations only)."""
        self.clock = clock
        self._lock = threading.Lock()
        self._models: OrderedDict[str, dict[str, Any]] = OrderedDict()  # digest -> its record
        self._uploads: dict[int, dict[str, Any]] = {}  # uploads in flight (their digest is not known yet)
        self._ids = itertools.count(1)

    # -- the upload from a function's GPU client ----------------------------------------------
    def receiving(self, stream: BinaryIO, function: str, total: int | None) -> _Counted:
        """`stream`, counted as it is read: the upload shows its bytes so far while it lasts."""
        with self._lock:
            uid = next(self._ids)
            if len(self._uploads) < KEEP:
                self._uploads[uid] = {
                    "function": function,
                    "state": "uploading",
                    "bytes": 0,
                    "total": total,
                    "started": self.clock(),
                }
            record = self._uploads.get(uid)
        return _Counted(stream, record, lambda: self._end_upload(uid))

    def _end_upload(self, uid: int) -> None:
        with self._lock:
            self._uploads.pop(uid, None)

    def uploaded(self, counted: _Counted, digest: str, size: int) -> None:
        counted.close()
        record = counted.record
        started = record["started"] if record else self.clock()
        function = record["function"] if record else ""
        with self._lock:
            known = self._models.get(digest, {}).get("state") in ("copying", "loaded")
        # another replica's upload of a model already on its way to a unit, or loaded: it stays there
        state = {} if known else {"state": "uploaded"}
        self._set(digest, **state, function=function, size=size, upload_s=self.clock() - started)

    # -- the scheduler's side of a load ----------------------------------------------------------
    def copying(self, digest: str, unit: str) -> None:
        """The artifact is being sent to the GPU Manager of `unit` (the manager did not have it)."""
        self._set(digest, state="copying", unit=unit)

    def loaded(self, digest: str, unit: str, load_s: float) -> None:
        """A job of `digest` was answered by `unit` after loading the model (a cache miss)."""
        self._set(digest, state="loaded", unit=unit, load_s=round(load_s, 3))

    def _set(self, digest: str, **fields: Any) -> None:
        with self._lock:
            record = self._models.pop(digest, None) or {"digest": digest}
            if not fields.get("function"):
                fields.pop("function", None)  # a second replica's upload, or a copy: keep who uploaded it
            record.update(fields)
            self._models[digest] = record  # the newest last
            while len(self._models) > KEEP:
                self._models.popitem(last=False)

    def status(self) -> dict[str, list[dict[str, Any]]]:
        """{"uploading": [{function, bytes, total, s}], "models": [{digest, function, state, size,
        unit, load_s, upload_s}]}: uploads in flight, then every model known, oldest first."""
        now = self.clock()
        with self._lock:
            uploading = [
                {k: v for k, v in u.items() if k != "started"} | {"s": round(now - u["started"], 3)}
                for u in self._uploads.values()
            ]
            models = [
                {**m, **({"upload_s": round(m["upload_s"], 3)} if "upload_s" in m else {})}
                for m in self._models.values()
            ]
        return {"uploading": uploading, "models": models}


class _Counted:
    """A request body read through: each read adds its bytes to the upload's record."""

    def __init__(self, stream: BinaryIO, record: dict[str, Any] | None, end: Callable[[], object]):
        self._stream, self.record, self._end = stream, record, end
        self._closed = False

    def read(self, n: int = -1) -> bytes:
        chunk = self._stream.read(n)
        if self.record is not None:
            self.record["bytes"] += len(chunk)  # one writer (this request); readers see a whole int
        return chunk

    def close(self) -> None:
        """No longer in flight (once; the record stays readable)."""
        if not self._closed:
            self._closed = True
            self._end()
