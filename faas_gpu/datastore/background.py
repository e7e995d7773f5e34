"""Datastore reads and writes off a request's thread, so that no job waits on the datastore.

Why (issue 42): with etcd stopped, every job route that read a credential or wrote a record
waited for etcd's retries (5 s for the first call, half a second for each one after), and the
GPU path, whose every fact the daemons already held, stalled into timeouts. A daemon keeps what
it read and answers from it; the reads that keep those answers fresh run here, on a few threads
of their own: one in flight per key (a thousand jobs do not make a thousand reads), and `down`
says whether the store answered the last one, so a caller holding an answer does not wait for a
store that is known not to answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from .base import DatastoreUnavailable

T = TypeVar("T")


class Background:
    def __init__(self, workers: int = 2, name: str = "datastore"):
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._inflight: dict[Hashable, Future] = {}
        self._lock = threading.Lock()
        self.down = False
        """The last call here raised DatastoreUnavailable (and none has succeeded since)."""

    def submit(self, key: Hashable, call: Callable[[], T]) -> Future[T]:
        """`call` on a background thread, unless one for `key` is in flight: that one's future."""
        with self._lock:
            running = self._inflight.get(key)
            if running is not None:
                return running
            future = self._pool.submit(self._run, key, call)
            self._inflight[key] = future
            return future

    def _run(self, key: Hashable, call: Callable[[], T]) -> T:
        try:
            out = call()
        except DatastoreUnavailable:
            self.down = True
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)
        self.down = False
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
