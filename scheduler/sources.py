"""Which artifact a function already uploaded for a model it builds the same way again.

Why: a python3-gpu handler that builds its model in code (`faas_gpu.remote(module)`) has its
replica export it (torch.export) and upload it on its first batch: seconds of a replica's cold
start, paid again by every replica the function starts, every wake-up from zero included, for
the same bytes. The replica names what it would export by a digest of its source (the module's
code, weights and input: `faas_gpu.saving.source_digest`, or the artifact file's own SHA-256),
sends it with its upload (`X-Faas-Gpu-Model-Source`), and a later replica of the same function
asks for it (`GET /v1/model-sources/<source>`) before exporting anything.

Kept per function (the caller's identity from its own token): a function learns only digests it
uploaded itself, and the job route checks ownership as before. In memory, bounded: a scheduler
that restarts forgets them, and replicas export once more.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

SOURCE_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_SOURCES = 4096


def valid_source(raw: str | None) -> str | None:
    """The source digest if `raw` is one (64 lower-case hex digits), else None."""
    if raw is None:
        return None
    raw = raw.strip()
    return raw if SOURCE_RE.match(raw) else None


class ModelSources:
    """(function, source) -> the digest it uploaded for it, the least recently used dropped first."""

    def __init__(self, limit: int = MAX_SOURCES):
        self.limit = limit
        self._known: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def uploaded(self, function: str, source: str, digest: str) -> None:
        with self._lock:
            self._known[(function, source)] = digest
            self._known.move_to_end((function, source))
            while len(self._known) > self.limit:
                self._known.popitem(last=False)

    def digest(self, function: str, source: str) -> str | None:
        with self._lock:
            found = self._known.get((function, source))
            if found is not None:
                self._known.move_to_end((function, source))
            return found
