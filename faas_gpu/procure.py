"""`python -m faas_gpu.procure`: PROTEAN's cost-aware procurement (§4.5) as a daemon.

Every second the daemon drives the pure `Procurement` policy with a `CloudProvider` and applies
its decisions: nodes are bought as spot VMs, a failed spot request is followed by an on-demand
one, and a spot VM's eviction notice cordons the node (`/faas-gpu/cordon/<node>` in the
datastore, so the scheduler places nothing new there), a replacement is bought at once (spot
first), and the cordoned node is released once it is idle. `CostMeter` charges every node from
its acquisition to its release or eviction with cocktail's spot prices and an on-demand price of
the spot mean / 0.30 (PROTEAN's `assumptions.yaml`, `simulator.on_demand_price`).

The cloud is `EmulatedCloud` (seeded, revocation probability `--p-rev`): it stands in for an IaaS
API, as the paper's own evaluation emulates revocations and prices. How its nodes map to the
stack: a node's id (`spot-1`, `on-demand-2`, ...) is a GPU Manager's `--node` name. A node is
ready when the cloud says it has booted and a GPU Manager with that name reports units
(`--no-managers`: boot alone); it is idle when it has been cordoned for `--drain-grace` seconds
(the scheduler has seen the cordon) and none of its units reports a running job. `--launch CMD`
starts one GPU Manager per node (`{node}` and `{port}` are filled in) and stops it when the node
goes, standing in for the VM; a node that goes also loses its unit reports and its cordon key.

What it did and what it cost: a JSON status file (`<home>/procurement.json`), an optional
read-only `GET /status` on 127.0.0.1 (`--status-port`), and log lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from faas_gpu import paths
from faas_gpu.cloud import CloudProvider, EmulatedCloud
from faas_gpu.contract import keys
from faas_gpu.cordon import cordon, uncordon
from faas_gpu.datastore import Datastore
from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.protean import (
    CostMeter,
    Node,
    NodeKind,
    NodeState,
    PriceSeries,
    Procurement,
    ProcurementDecision,
    ProcurementSnapshot,
)
from faas_gpu.policies.protean.procurement import SPOT_SHARE_OF_ON_DEMAND

log = logging.getLogger("procure")

UNITS_PREFIX = keys.UNITS  # where the GPU Managers report their units
DEFAULT_SPOT_CSV = SHARED_DATA / "cocktail" / "spot.csv"


def load_prices(path: Path, column: str = "spot1", step_s: float = 60.0) -> tuple[PriceSeries, float]:
    """Cocktail's spot series ($/h, one value per `step_s`) and the on-demand price it implies."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--spot-prices: cannot read {path}: {exc.strerror or exc}") from None
    try:
        spot = PriceSeries.from_csv_text(text, column, step_s)
    except ValueError as exc:
        raise ValueError(f"--spot-prices: {path}: {exc}") from None
    return spot, spot.mean / SPOT_SHARE_OF_ON_DEMAND


class Launcher:
    """One local process per node (e.g. a GPU Manager with `--node {node}`), standing in for its VM."""

    def __init__(self, template: str, log_dir: Path):
        self.template, self.log_dir = template, log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, node: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = shlex.split(self.template.format(node=node, port=port))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{node}.log", "ab") as out:
            self.procs[node] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, node: str) -> None:
        proc = self.procs.pop(node, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class HeldNode:
    node: Node
    charged_to: float
    cordoned_at: float | None = None
    reason: str = ""
    evict_at: float | None = None

    @property
    def id(self) -> str:
        return self.node.id


@dataclass
class Counts:
    acquired: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in NodeKind})
    failed: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in NodeKind})
    notices: int = 0
    evicted: int = 0
    released: int = 0


class Procurer:
    """Applies `Procurement` decisions to a cloud, the datastore and the cost meter, one tick at a time.

    `now` is the daemon's time in seconds (the cloud's and the price series' time axis)."""

    def __init__(
        self,
        datastore: Datastore,
        cloud: CloudProvider,
        policy: Procurement,
        meter: CostMeter,
        *,
        drain_grace_s: float = 2.0,
        require_manager: bool = True,
        status_path: Path | None = None,
        launcher: Launcher | None = None,
        wall: Callable[[], float] = time.time,
    ):
        if drain_grace_s < 0:
            raise ValueError(f"drain_grace_s: must be >= 0, got {drain_grace_s}")
        self.ds, self.cloud, self.policy, self.meter = datastore, cloud, policy, meter
        self.drain_grace_s, self.require_manager = drain_grace_s, require_manager
        self.status_path, self.launcher, self.wall = status_path, launcher, wall
        self.nodes: dict[str, HeldNode] = {}
        self.counts = Counts()
        self.events: deque[dict] = deque(maxlen=100)
        self._failed: list[NodeKind] = []
        self._lock = threading.Lock()
        self._status: dict = {}
        self._now = 0.0

    # -- the loop body -----------------------------------------------------------------------
    def tick(self, now: float) -> ProcurementDecision:
        with self._lock:
            self._now = now
            for nid in self.cloud.evicted(now):
                held = self.nodes.get(nid)
                if held is not None:
                    self.counts.evicted += 1
                    self._gone(held, now, "evicted")
            notices = [n for n in self.cloud.eviction_notices(now) if n.node in self.nodes]
            for n in notices:
                self.counts.notices += 1
                self.nodes[n.node].evict_at = n.evict_at
                self._event(now, "notice", n.node, evictIn=round(n.evict_at - now, 1))
            for held in self.nodes.values():
                self._charge(held, now)
            units = self._units()
            states = [
                NodeState(
                    h.id,
                    h.node.kind,
                    ready=self._ready(h, now, units),
                    cordoned=h.cordoned_at is not None,
                    idle=self._idle(h, now, units),
                )
                for h in self.nodes.values()
            ]
            decision = self.policy.observe(ProcurementSnapshot(states, notices, self._failed), now)
            self._failed = []
            for nid in decision.cordon:
                held = self.nodes.get(nid)
                if held is None or held.cordoned_at is not None:
                    continue
                held.cordoned_at = now
                held.reason = "eviction notice" if held.evict_at is not None else "retired: spot is back"
                extra = {"evictIn": round(held.evict_at - now, 1)} if held.evict_at is not None else {}
                cordon(self.ds, nid, held.reason, **extra)
                self._event(now, "cordon", nid, reason=held.reason)
            for kind in decision.acquire:
                node = self.cloud.acquire(kind, now)
                if node is None:
                    self._failed.append(kind)
                    self.counts.failed[kind.value] += 1
                    self._event(now, "acquire-failed", None, kind=kind.value)
                    continue
                self.nodes[node.id] = HeldNode(node, now)
                self.counts.acquired[kind.value] += 1
                self._event(now, "acquire", node.id, kind=kind.value)
                if self.launcher is not None:
                    self.launcher.start(node.id)
            for nid in decision.release:
                held = self.nodes.get(nid)
                if held is not None:
                    self.cloud.release(nid, now)
                    self.counts.released += 1
                    self._gone(held, now, "release")
        self._write(now)
        return decision

    def close(self, now: float) -> None:
        """A stopped daemon holds no VMs: release every node (charged up to now)."""
        with self._lock:
            for held in list(self.nodes.values()):
                self.cloud.release(held.id, now)
                self.counts.released += 1
                self._gone(held, now, "release")
        self._write(now)

    def _write(self, now: float) -> None:
        with self._lock:
            self._status = self._describe(now)
        if self.status_path is not None:
            tmp = self.status_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._status, indent=1))
            tmp.replace(self.status_path)

    # -- what it sees ------------------------------------------------------------------------
    def _units(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for kv in self.ds.get_prefix(UNITS_PREFIX):
            try:
                body = json.loads(kv.value)
                out.setdefault(body["node"], []).append(body)
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def _ready(self, held: HeldNode, now: float, units: dict[str, list[dict]]) -> bool:
        booted = now >= held.node.ready_at
        return booted and (not self.require_manager or bool(units.get(held.id)))

    def _idle(self, held: HeldNode, now: float, units: dict[str, list[dict]]) -> bool:
        if held.cordoned_at is None or now - held.cordoned_at < self.drain_grace_s:
            return False  # the scheduler may not have seen the cordon yet
        return not any(u.get("state") == "busy" for u in units.get(held.id, []))

    # -- what it does ------------------------------------------------------------------------
    def _charge(self, held: HeldNode, now: float) -> None:
        self.meter.add(held.node.kind, held.charged_to, now)
        held.charged_to = max(held.charged_to, now)

    def _gone(self, held: HeldNode, now: float, event: str) -> None:
        self._charge(held, now)
        self.nodes.pop(held.id, None)
        if self.launcher is not None:
            self.launcher.stop(held.id)
        self.ds.delete_prefix(f"{UNITS_PREFIX}{held.id}/")
        uncordon(self.ds, held.id)
        self._event(now, event, held.id, kind=held.node.kind.value)

    def _event(self, now: float, what: str, node: str | None, **extra: object) -> None:
        entry = {"t": round(now, 3), "event": what, **({"node": node} if node else {}), **extra}
        self.events.append(entry)
        detail = " ".join(f"{k}={v}" for k, v in extra.items())
        log.info("procure: %s %s %s (cost so far $%.4f)", what, node or "", detail, self.meter.total)

    def status(self) -> dict:
        with self._lock:
            return dict(self._status)

    def _describe(self, now: float) -> dict:
        m = self.meter
        od_equivalent = m.on_demand_equivalent()

        def state(h: HeldNode) -> str:
            if h.cordoned_at is not None:
                return "cordoned"
            return "ready" if now >= h.node.ready_at else "booting"

        return {
            "updated": self.wall(),
            "t": round(now, 3),
            "mode": self.policy.mode,
            "targetNodes": self.policy.target_nodes,
            "nodes": [
                {
                    "id": h.id,
                    "kind": h.node.kind.value,
                    "state": state(h),
                    "acquiredAt": round(h.node.requested_at, 3),
                    "readyAt": round(h.node.ready_at, 3),
                    **({"reason": h.reason} if h.cordoned_at is not None else {}),
                    **({"evictAt": round(h.evict_at, 3)} if h.evict_at is not None else {}),
                }
                for h in self.nodes.values()
            ],
            "prices": {
                "spotPerHour": m.spot.at(now),
                "onDemandPerHour": m.on_demand_per_hour,
            },
            "cost": {
                "dollars": {k.value: v for k, v in m.dollars.items()},  # unrounded: a short hold costs micro-dollars
                "nodeSeconds": {k.value: round(v, 3) for k, v in m.node_seconds.items()},
                "total": m.total,
                "onDemandEquivalent": od_equivalent,
                "savings": round(1 - m.total / od_equivalent, 4) if od_equivalent > 0 else 0.0,
            },
            "counts": {
                "acquired": dict(self.counts.acquired),
                "failed": dict(self.counts.failed),
                "notices": self.counts.notices,
                "evicted": self.counts.evicted,
                "released": self.counts.released,
            },
            "events": list(self.events)[-50:],
        }


def serve_status(procurer: Procurer, port: int) -> ThreadingHTTPServer:
    """`GET /status` on 127.0.0.1: the status as JSON; read-only, loopback only."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path.split("?", 1)[0] not in ("/status", "/"):
                self.send_error(404, "only /status is served")
                return
            body = json.dumps(procurer.status()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="procure-status", daemon=True).start()
    return server


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m faas_gpu.procure", description=__doc__.split("\n\n")[0])
    p.add_argument("--home", type=Path, help="state folder (default $FAAS_GPU_HOME or ./.faas-gpu)")
    p.add_argument("--etcd", help="etcd URL (default: the embedded datastore in --home)")
    p.add_argument("--nodes", type=int, default=1, help="GPU nodes to keep serving (default 1)")
    p.add_argument("--mode", choices=Procurement.MODES, default="hybrid", help="hybrid: spot first, on-demand backup")
    p.add_argument("--seed", type=int, default=0, help="the emulated cloud's seed")
    p.add_argument("--p-rev", type=float, default=0.354, help="revocation probability per spot node and interval")
    p.add_argument("--eviction-interval", type=float, default=60.0, help="seconds between revocation draws")
    p.add_argument("--boot", type=float, default=45.0, help="seconds from request to a booted VM")
    p.add_argument("--spot-availability", type=float, help="chance a spot request succeeds (default 1 - p-rev)")
    p.add_argument("--spot-retry", type=float, default=60.0, help="seconds before spot is tried again after a failure")
    p.add_argument(
        "--spot-prices", type=Path, help=f"cocktail's spot.csv (default $FAAS_GPU_SPOT_PRICES or {DEFAULT_SPOT_CSV})"
    )
    p.add_argument("--spot-column", default="spot1", help="the price series' column (default spot1)")
    p.add_argument("--price-step", type=float, default=60.0, help="seconds per price in the series (default 60)")
    p.add_argument("--on-demand-price", type=float, help="$/h (default: the spot series' mean / 0.30)")
    p.add_argument("--drain-grace", type=float, default=2.0, help="seconds a cordon stands before a node may be idle")
    p.add_argument("--no-managers", action="store_true", help="a node is ready once booted (no GPU Manager needed)")
    p.add_argument("--launch", help="command run per node, e.g. 'python -m gpu_manager --node {node} --port {port}'")
    p.add_argument("--period", type=float, default=1.0, help="seconds between decisions (default 1)")
    p.add_argument("--status-file", type=Path, help="JSON status (default <home>/procurement.json)")
    p.add_argument("--status-port", type=int, help="serve GET /status on 127.0.0.1:PORT")
    a = p.parse_args(argv)
    if a.home is None:
        from faas_gpu import paths

        a.home = paths.home()
    a.home = a.home.resolve()
    if a.spot_prices is None:
        a.spot_prices = Path(os.environ.get("FAAS_GPU_SPOT_PRICES") or DEFAULT_SPOT_CSV)
    for name in ("nodes", "period", "boot", "eviction_interval", "price_step"):
        value = getattr(a, name)
        if value < 0 or (value == 0 and name in ("period", "eviction_interval", "price_step")):
            p.error(f"--{name.replace('_', '-')}: must be positive, got {value}")
    for name in ("p_rev", "spot_availability"):
        value = getattr(a, name)
        if value is not None and not 0 <= value <= 1:
            p.error(f"--{name.replace('_', '-')}: must be in [0, 1], got {value}")
    return a


def build(a: argparse.Namespace, datastore: Datastore) -> Procurer:
    spot, on_demand = load_prices(a.spot_prices, a.spot_column, a.price_step)
    on_demand = a.on_demand_price if a.on_demand_price is not None else on_demand
    cloud = EmulatedCloud(
        a.seed,
        a.p_rev,
        eviction_interval_s=a.eviction_interval,
        boot_s=a.boot,
        spot_availability=a.spot_availability,
        spot_prices=spot,
        on_demand_per_hour=on_demand,
    )
    policy = Procurement(a.nodes, a.mode, spot_retry_s=a.spot_retry)
    a.home.mkdir(parents=True, exist_ok=True)
    return Procurer(
        datastore,
        cloud,
        policy,
        CostMeter(spot, on_demand),
        drain_grace_s=a.drain_grace,
        require_manager=not a.no_managers,
        status_path=a.status_file or a.home / "procurement.json",
        launcher=Launcher(a.launch, a.home / "logs" / "nodes") if a.launch else None,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    a = parse_args(argv)
    from faas_gpu.datastore import open_datastore

    try:
        ds = open_datastore(a.etcd, paths.state_db(a.home))
        procurer = build(a, ds)
    except ValueError as exc:
        print(f"procure: {exc}", file=sys.stderr)
        return 2
    server = serve_status(procurer, a.status_port) if a.status_port is not None else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    t0 = time.monotonic()
    log.info(
        "procure: keeping %d node(s), mode %s, p_rev %g; status in %s",
        a.nodes,
        a.mode,
        a.p_rev,
        procurer.status_path,
    )
    last_summary = -60.0
    while not stop.is_set():
        now = time.monotonic() - t0
        try:
            procurer.tick(now)
        except Exception:  # a datastore restart must not end procurement
            log.exception("procure: tick failed")
        if now - last_summary >= 60:
            last_summary = now
            s = procurer.status()
            if s:
                c = s["cost"]
                log.info(
                    "procure: %d node(s); cost $%.4f (spot $%.4f, on-demand $%.4f; all on-demand $%.4f)",
                    len(s["nodes"]),
                    c["total"],
                    c["dollars"]["spot"],
                    c["dollars"]["on-demand"],
                    c["onDemandEquivalent"],
                )
        stop.wait(a.period)
    procurer.close(time.monotonic() - t0)
    if server is not None:
        server.shutdown()
    ds.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
