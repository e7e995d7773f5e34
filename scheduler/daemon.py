"""`python -m scheduler`: the global scheduler (LALB-O3), one leader among its replicas."""

from __future__ import annotations

import argparse
import logging
import socket
import uuid
from pathlib import Path

from faas_gpu.datastore import open_datastore
from faas_gpu.serving import OneWorkerServer
from gpu_manager.daemon import ensure_token
from gpu_manager.model_store import ModelStore

log = logging.getLogger("scheduler")


class _Daemon:
    """Built inside the gunicorn worker: the scheduler, its leader election, and the API."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.parts: tuple = ()

    def load(self):
        from .api import create_app
        from .core import Scheduler
        from .leader import LeaderElection

        a = self.args
        ds = open_datastore(a.etcd, a.home / "state.db")
        token = ensure_token(a.home / "secrets")
        scheduler = Scheduler(
            ds,
            ModelStore(a.home / "scheduler-models", a.max_model_bytes),
            token,
            policy=a.policy,
            o3_limit=a.o3_limit,
            no_units_timeout_s=a.no_units_timeout,
            be_max_wait_s=a.be_max_wait,
        )
        identity = f"{a.advertise or a.bind}:{a.port}/{socket.gethostname()}/{uuid.uuid4().hex[:6]}"
        election = LeaderElection(ds, identity, ttl_s=a.leader_ttl)
        election.step()
        election.start()
        scheduler.start()
        self.parts = (scheduler, election)
        log.info("scheduler %s started (%s)", identity, "leader" if election.is_leader.is_set() else "follower")
        return create_app(scheduler, election, token)

    def close(self) -> None:
        for part in self.parts[::-1]:
            (part.stop if hasattr(part, "stop") else part.close)()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scheduler", description=__doc__)
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--advertise")
    p.add_argument("--etcd", help="etcd URL (default: the embedded datastore in --home)")
    p.add_argument("--policy", choices=["lb", "lalb", "lalb_o3"], default="lalb_o3")
    p.add_argument("--o3-limit", type=int, default=25)
    p.add_argument("--leader-ttl", type=int, default=3)
    p.add_argument(
        "--no-units-timeout", type=float, default=10.0, help="fail queued jobs (503) after this long with no unit"
    )
    p.add_argument(
        "--be-max-wait", type=float, default=5.0, help="longest a best-effort job waits behind strict ones (s)"
    )
    p.add_argument("--max-model-bytes", type=int, default=2 * 1024**3)
    p.add_argument("--threads", type=int, default=64)
    args = p.parse_args(argv)
    if args.home is None:
        from faas_gpu import paths

        args.home = paths.home()
    args.home = args.home.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    daemon = _Daemon(args)
    OneWorkerServer(
        [f"{args.bind}:{args.port}"], daemon.load, daemon.close, threads=args.threads, timeout_s=600, name="scheduler"
    ).run()
    return 0
