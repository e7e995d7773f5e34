"""Leader election over the datastore: the leader holds a key under a lease and refreshes it.

When the leader dies its lease expires (ttl), the key vanishes, and a follower's `create`
succeeds: it becomes the leader. Works on etcd and on the embedded store alike.
"""

from __future__ import annotations

import logging
import threading

from faas_gpu.contract import keys
from faas_gpu.datastore import Datastore, DatastoreUnavailable
from faas_gpu.schedulers import Announcement

log = logging.getLogger(__name__)
LEADER_KEY = keys.SCHEDULER_LEADER


def same_replica(a: str, b: str) -> bool:
    """Two scheduler identities (`address:port/host/nonce`, `scheduler.daemon`) of one replica:
    the same address, port and host, whatever the process."""
    return a.rsplit("/", 1)[0] == b.rsplit("/", 1)[0] and a.count("/") == b.count("/") == 2


class LeaderElection:
    def __init__(
        self,
        ds: Datastore,
        identity: str,
        ttl_s: int = 3,
        key: str = LEADER_KEY,
        announcement: Announcement | None = None,
    ):
        self.ds, self.identity, self.ttl_s, self.key = ds, identity, ttl_s, key
        self.announcement = announcement  # leader or follower: the provider finds every replica
        self.is_leader = threading.Event()
        self._lease = None
        self._unreachable = False  # leading through a datastore outage
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def leader(self) -> str | None:
        kv = self.ds.get(self.key)
        return kv.value.decode() if kv else None

    def step(self) -> None:
        """One round: refresh leadership, or try to take it (and the replica's announcement)."""
        if self.announcement is not None:
            try:
                self.announcement.step()
            except Exception as exc:  # the datastore restarting: the next round announces again
                log.warning("scheduler announcement failed: %s", exc)
        if self.is_leader.is_set():
            try:
                self._lease.refresh()
                if self.leader() == self.identity:
                    self._unreachable = False
                    return
            except DatastoreUnavailable as exc:
                # Nobody can be elected while the datastore is away, so the leader keeps placing
                # jobs (its units and queues are in memory) rather than stopping the GPU path for
                # the whole outage. Its lease has expired by the time the datastore is back: the
                # next round steps down and stands again. In a partition where only this replica
                # lost the datastore, two leaders place jobs for a while: that costs cache
                # locality, not correctness, since each job still runs once on the unit it is sent to.
                if not self._unreachable:
                    log.warning("datastore unreachable; keeping scheduler leadership until it is back: %s", exc)
                self._unreachable = True
                return
            except Exception as exc:
                log.warning("lost leadership: %s", exc)
            self._unreachable = False
            self.is_leader.clear()
            self._lease = None
        lease = self.ds.lease(self.ttl_s)
        if self.ds.create(self.key, self.identity, lease=lease) or self._take_over(lease):
            self._lease = lease
            self.is_leader.set()
            log.info("%s is the scheduler leader", self.identity)
        else:
            lease.revoke()

    def _take_over(self, lease) -> bool:
        """The leader key names this very replica's previous process (the same address, port and
        host; kill -9 of its gunicorn worker, or of the daemon that the supervisor restarted): it
        is dead, for only one process at a time serves this port, so its lease is ended now rather
        than waited out (a scheduler restart cost the GPU path its leader for the lease's TTL)."""
        held = self.ds.get(self.key)
        if held is None or held.lease is None:
            return False
        holder = held.value.decode(errors="replace")
        if holder == self.identity or not same_replica(holder, self.identity):
            return False
        log.info("the leader key names %s, this replica's previous process: taking over at once", holder)
        self.ds.revoke_lease(held.lease)  # its expiry, brought forward: a lease renewed since is not this one
        return self.ds.create(self.key, self.identity, lease=lease)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.step()
            except Exception as exc:  # the datastore restarting: try again next round
                log.warning("leader election round failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self.announcement is not None:
            self.announcement.withdraw()
        if self.is_leader.is_set() and self._lease is not None:
            try:
                self._lease.revoke()  # hand over at once rather than after the ttl
            except Exception:
                pass
        self.is_leader.clear()
