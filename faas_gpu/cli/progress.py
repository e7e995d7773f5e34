"""What a function is waiting for, as one line on a terminal while the CLI waits for it.

`up` waits for each function's replicas; the first `invoke` of a function on the GPU path waits
for its model's cold start: the instance exports it (torch.export), uploads it to the scheduler,
the scheduler sends it to a GPU Manager, which loads it on a unit. All of that happens between
daemons, so the line reads where it stands from the stack's own status, the gateway's
`GET /ui/api/status` (the status page's JSON, behind the same basic auth as `/system/*`):
the function's replicas, the uploads the scheduler is receiving and each model's state there
(`scheduler.model_states`), and the units' reports (a unit running a model not yet in its cache
is loading it).

Shown only when stderr is a terminal (tqdm's `disable=None`) and not turned off with
`--no-progress`: in a pipe or a log the output stays byte for byte what it was, and no status is
asked for. `invoke` starts looking only after `INVOKE_DELAY_S`, so a warm call asks for nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from tqdm import tqdm

from .common import DEFAULT_NAMESPACE, Client

INVOKE_DELAY_S = 1.0
"""A call answered sooner shows nothing (and asks for no status): only a cold start is slow."""
POLL_S = 0.5
STAGES = ("replicas", "exporting", "uploading", "uploaded", "copying", "loading", "loaded")
"""A cold start's stages in the order they happen (`Stage.key`)."""


@dataclass(frozen=True)
class Stage:
    key: str  # one of STAGES
    text: str


def _mb(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MB"


def _list(value: object) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def replicas_stage(available: int, wanted: int) -> Stage:
    return Stage("replicas", f"{available}/{max(wanted, 1)} replicas ready")


def stage_of(status: dict, name: str, namespace: str | None = None) -> Stage | None:
    """Where `name`'s first call stands, from the gateway's status JSON; None: nothing to say
    (the function is not in the status)."""
    key = f"{name}.{namespace or DEFAULT_NAMESPACE}"
    fn = next(
        (
            f
            for f in _list(_dict(status.get("functions")).get("items"))
            if f.get("name") == name and f.get("namespace") == (namespace or DEFAULT_NAMESPACE)
        ),
        None,
    )
    if fn is None:
        return None
    available = int(fn.get("availableReplicas") or 0)
    if available == 0:
        return replicas_stage(0, int(fn.get("replicas") or 1))
    scheduler = _dict(status.get("scheduler"))
    for u in _list(scheduler.get("uploading")):
        if u.get("function") == key:
            return Stage("uploading", f"uploading the model: {_mb(u.get('bytes'))} of {_mb(u.get('total'))}")
    records = [m for m in _list(scheduler.get("models")) if key in (m.get("functions") or [])]
    ours = {m.get("digest") for m in records}
    for unit in _list(status.get("units")):
        running = _dict(unit.get("running"))
        cached = {m.get("digest") for m in _list(unit.get("models"))}
        if running and (key in (running.get("functions") or []) or running.get("digest") in ours):
            if running.get("digest") not in cached:
                busy = unit.get("busyForS")
                since = f" ({busy:.0f} s)" if isinstance(busy, int | float) else ""
                return Stage("loading", f"loading the model on unit {unit.get('key')}{since}")
    if records:
        m = records[-1]  # the newest
        if m.get("state") == "copying":
            return Stage("copying", f"sending the model to unit {m.get('unit')}'s GPU Manager")
        if m.get("state") == "loaded":
            load = m.get("loadS")
            took = f" in {load:.1f} s" if isinstance(load, int | float) else ""
            return Stage("loaded", f"model loaded on unit {m.get('unit')}{took}")
        if m.get("state") == "uploaded":
            return Stage("uploaded", f"model uploaded ({_mb(m.get('size'))}); waiting for a unit")
    if _dict(scheduler).get("configured") is False:
        return None  # no GPU path: the model runs in the instance
    return Stage("exporting", "waiting; no model uploaded yet (a first call exports and uploads it)")


class Progress:
    """One tqdm line naming the stage; nothing (and no thread) when `file` is not a terminal or
    `enabled` is False. `shown`: the stages shown, in order (each once per change)."""

    def __init__(self, name: str, *, file: IO[str] | None = None, enabled: bool = True):
        self.name = name
        self.file = file if file is not None else sys.stderr
        self.shown: list[Stage] = []
        self._bar: tqdm | None = None
        self.active = enabled and _is_terminal(self.file)
        self._started = time.time()  # tqdm's clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def show(self, stage: Stage | None) -> None:
        if not self.active or stage is None:
            return
        if self.shown and self.shown[-1] == stage:
            if self._bar is not None:
                self._bar.refresh()  # the elapsed time moves on
            return
        self.shown.append(stage)
        line = f"{self.name}: {stage.text}"
        if self._bar is None:  # disable=None: tqdm's own check that the file is a terminal
            self._bar = tqdm(
                total=None,
                desc=line,
                disable=None,
                file=self.file,
                leave=False,
                mininterval=0,
                bar_format="{desc} [{elapsed}]",
            )
            self._bar.start_t = self._started  # the elapsed time of the wait, not of the line
            self._bar.refresh()
        else:
            self._bar.set_description_str(line)

    def watch(self, fetch: Callable[[], dict | None], namespace: str | None, delay_s: float = INVOKE_DELAY_S) -> None:
        """Poll `fetch` (the status JSON, None when unreadable) in the background from `delay_s` on."""
        if not self.active:
            return

        def run() -> None:
            if self._stop.wait(delay_s):
                return
            while True:
                status = fetch()
                stage = stage_of(status, self.name, namespace) if status is not None else None
                if self._stop.is_set():
                    return
                self.show(stage or Stage("waiting", "waiting for the answer"))
                if self._stop.wait(POLL_S):
                    return

        self._thread = threading.Thread(target=run, name="progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._bar is not None:
            self._bar.close()  # leave=False: the line is wiped, the command's own output follows

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(file: IO[str]) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def status_fetcher(client: Client) -> Callable[[], dict[str, Any] | None]:
    """The gateway's status JSON with the command's system credentials; None when it cannot be read
    (no credentials, an older gateway): the line then only says that the call is waiting."""

    def fetch() -> dict[str, Any] | None:
        if client.auth is None:
            return None
        try:
            resp = client.session.get(client.gateway + "/ui/api/status", auth=client.auth, timeout=(2, 5))
            body = resp.json() if resp.status_code == 200 else None
        except Exception:  # noqa: BLE001 — the progress line must never fail the call it decorates
            return None
        return body if isinstance(body, dict) else None

    return fetch
