"""Where the schedulers are: each scheduler replica announces its URL in the datastore (under a
lease, so a dead one drops out), and the provider hands every announced one to the replicas it
starts, beside the URLs it was given (`--scheduler`). A second scheduler started later is found
without restarting the gateway; the GPU client fails over between them."""

from __future__ import annotations

import logging
import threading

from faas_gpu.contract import keys
from faas_gpu.datastore import Datastore, Lease

log = logging.getLogger(__name__)
MEMBERS_PREFIX = keys.SCHEDULER_MEMBERS


class Announcement:
    """One scheduler's `MEMBERS_PREFIX<identity>` = its URL, kept alive by `step` each round."""

    def __init__(self, ds: Datastore, identity: str, url: str, ttl_s: int):
        self.ds, self.key, self.url, self.ttl_s = ds, MEMBERS_PREFIX + identity.replace("/", "_"), url, ttl_s
        self._lease: Lease | None = None

    def step(self) -> None:
        if self._lease is not None:
            try:
                self._lease.refresh()
                return
            except Exception as exc:  # noqa: BLE001 — expired, or the datastore restarted: announce anew
                log.info("scheduler announcement lapsed (%s); announcing again", exc)
                self._lease = None
        lease = self.ds.lease(self.ttl_s)
        self.ds.put(self.key, self.url, lease=lease)
        self._lease = lease

    def withdraw(self) -> None:
        if self._lease is not None:
            try:
                self._lease.revoke()
            except Exception:  # noqa: BLE001 — it expires anyway
                pass
            self._lease = None


def announced(ds: Datastore) -> list[str]:
    """The URLs of the schedulers alive now, sorted."""
    return sorted({kv.value.decode() for kv in ds.get_prefix(MEMBERS_PREFIX)})


def merge(configured: str, found: list[str]) -> str:
    """The comma list FAAS_GPU_SCHEDULER_URL takes: the given URLs first, then the others found."""
    urls = [u.strip().rstrip("/") for u in configured.split(",") if u.strip()]
    return ",".join(urls + [u for u in (f.rstrip("/") for f in found) if u not in urls])


class Directory:
    """The announced schedulers, read every `every_s` in a thread of its own, so that starting a
    replica never waits on the datastore (a datastore that is down keeps the last list known)."""

    def __init__(self, ds: Datastore, every_s: float = 2.0):
        self.ds, self.every_s = ds, every_s
        self._urls: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler-directory", daemon=True)

    def start(self) -> Directory:
        self._refresh()
        self._thread.start()
        return self

    def urls(self) -> list[str]:
        return list(self._urls)

    def close(self) -> None:
        self._stop.set()

    def _refresh(self) -> None:
        try:
            self._urls = announced(self.ds)
        except Exception as exc:  # noqa: BLE001 — keep the last list; the next round tries again
            log.debug("cannot read the scheduler directory: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._refresh()
