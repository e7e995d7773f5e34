"""`python -m procurer`: PROTEAN's cost-aware procurement (§4.5) as a daemon.

Flags, wiring (datastore, emulated cloud, policy, meter) and the loop; what the daemon does is in
the package's docstring. The loop ticks `Procurer` every `--period` seconds on the monotonic
clock from start; a failed tick (e.g. a datastore restart) is logged and the next one tries
again.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from faas_gpu import paths
from faas_gpu.cloud import EmulatedCloud
from faas_gpu.contract import env as contract_env
from faas_gpu.datastore import Datastore
from faas_gpu.policies.protean import CostMeter, Procurement

from .core import Procurer
from .launcher import Launcher
from .metrics import procurer_metrics
from .prices import DEFAULT_SPOT_CSV, load_prices
from .status import serve_status

log = logging.getLogger("procure")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m procurer", description=__doc__.split("\n\n")[0])
    p.add_argument("--home", type=Path, help="state folder (default $FAAS_GPU_HOME or ./.faas-gpu)")
    p.add_argument("--etcd", help="etcd URL (default: the embedded datastore in --home)")
    p.add_argument("--etcd-credentials", type=Path, help=contract_env.ETCD_CREDENTIALS.doc)
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
    p.add_argument("--status-port", type=int, help="serve GET /status and /metrics on 127.0.0.1:PORT")
    a = p.parse_args(argv)
    if a.home is None:
        a.home = paths.home()
    a.home = a.home.resolve()
    if a.spot_prices is None:
        a.spot_prices = contract_env.SPOT_PRICES.read() or DEFAULT_SPOT_CSV
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
    from faas_gpu.credentials import ensure_token
    from faas_gpu.datastore import open_datastore

    try:
        ds = open_datastore(
            a.etcd,
            paths.state_db(a.home),
            cluster_token=ensure_token(a.home / "secrets"),  # records sealed and checked
            credentials_file=a.etcd_credentials or contract_env.ETCD_CREDENTIALS.read(),
            secrets_dir=a.home / "secrets",
        )
        procurer = build(a, ds)
    except ValueError as exc:
        print(f"procure: {exc}", file=sys.stderr)
        return 2
    server = None
    if a.status_port is not None:
        server = serve_status(procurer.status, a.status_port, procurer_metrics(procurer.status).exposition)
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
