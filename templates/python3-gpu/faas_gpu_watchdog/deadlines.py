"""Exec timeouts for calls served in this process: one thread and a heap of deadlines.

A handler running in a request's thread cannot be stopped, so its timeout is a reply, not a
kill: at the deadline the watchdog answers 504 on the call's connection and closes it, and the
handler's late result is dropped, as http mode answers 504 while its function process goes on.
A `threading.Timer` per call would start a thread per call; this keeps one, woken only when the
earliest deadline changes.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[list] = []  # [at, seq, fire or None once cancelled or fired]
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._cancelled = 0
        self._thread: threading.Thread | None = None

    def add(self, at: float, fire: Callable[[], None]) -> list:
        """Call `fire` (in a thread of its own) at monotonic time `at` unless `cancel`led first."""
        entry = [at, next(self._seq), fire]
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="exec-timeouts", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cv.notify()
        return entry

    def cancel(self, entry: list) -> None:
        with self._cv:
            if entry[2] is None:
                return
            entry[2] = None
            self._cancelled += 1
            # calls that end in time leave their entries behind: at 30 s and 1,000 calls a second,
            # 30,000 of them; drop them once they are half the heap
            if self._cancelled > 1024 and 2 * self._cancelled > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def __len__(self) -> int:
        with self._cv:
            return len(self._heap) - self._cancelled

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heapq.heappop(self._heap)
                        self._cancelled -= 1
                    if not self._heap:
                        self._cv.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        break
                    self._cv.wait(wait)
                entry = heapq.heappop(self._heap)
                fire, entry[2] = entry[2], None
            threading.Thread(target=fire, name="exec-timeout", daemon=True).start()
