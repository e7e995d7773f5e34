"""What replicas print and what the supervisor says about them, into the function's own log.

`faas-cli logs` and `/system/logs` read the function's log; the supervisor's lines (an exit,
a crash loop, a start that failed) go there too, beside the replicas' own output.
"""

from __future__ import annotations

import logging
import subprocess

from ..logs import LogStore
from ..types import FunctionRecord

log = logging.getLogger(__name__)


def pump(logs: LogStore, namespace: str, name: str, rid: str, proc: subprocess.Popen) -> None:
    """Copy a replica's output, line by line, until it exits (run in a thread per replica)."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        logs.append(namespace, name, rid, raw.decode("utf-8", "replace").rstrip("\n"))


def note(logs: LogStore, record: FunctionRecord, rid: str, text: str) -> None:
    """One line of the supervisor's in the function's log."""
    try:
        logs.append(record.namespace, record.name, rid, text)
    except OSError as exc:  # a name the file system refuses: the provider's own log has it
        log.warning(
            "%s.%s (%s): %s [function log not written: %s]",
            record.name[:80],
            record.namespace,
            rid,
            text,
            exc.strerror,
        )
