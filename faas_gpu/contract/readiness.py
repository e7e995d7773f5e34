"""What a replica's readiness answer means: the runtimes' probe and the watchdog agree on it.

A replica is Ready once its watchdog's `/_/ready` answers 200: the watchdog accepts calls and, where
the function has a readiness check (of-watchdog's `ready_path`; python3-gpu's index.py answers
`/_/ready` itself), that check passed. Kubernetes only knows ready or not; a runtime here also
needs to tell "not yet" (a model still loading) from "never" (a handler that raised at import),
so that describe says why and requests are answered at once instead of waiting for a replica
that will not come:

- 200: ready;
- 500 (`FAILED`): the function's own check says it cannot serve; the body says why. The replica
  is StartFailed: stopped and started again with back-off (a cause that passes, such as a
  dependency that was down, heals), and its reason shown until a replica of that version serves;
- anything else (503 while loading, 429 at the in-flight limit, no connection): not yet.
"""

from __future__ import annotations

PATH = "/_/ready"
"""The watchdog's readiness route (of-watchdog's, `pkg/readiness.go`)."""
TEMPLATE_READY_PATH = "/_/ready"
"""python3-gpu's readiness check, served by its index.py (the template's `ready_path`): the
watchdog routes `/_/ready` itself, so no call from outside reaches this path of the function."""
READY = 200
FAILED = 500
REASON_LIMIT = 500
"""Characters of a failed check's body kept as its reason (one line for describe)."""


def failure_reason(body: bytes) -> str:
    """The reason a failed readiness answer gives, as one bounded line."""
    text = " ".join(body.decode("utf-8", "replace").split())
    return (text[:REASON_LIMIT] + "…") if len(text) > REASON_LIMIT else (text or "its readiness check failed")
