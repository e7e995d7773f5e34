"""`python -m scheduler`: the global scheduler (LALB-O3), one leader among its replicas.

With `--reconfigure` the leader also runs PROTEAN's GPU Reconfigurator (`scheduler.reconfigure`):
every `--monitor-interval` seconds it re-slices MIG GPUs through their managers.
With `--distribution protean` (the default with `--reconfigure`: Alg. 2 sizes the small slices
for the best-effort work that Alg. 1 puts there) PROTEAN's Job Distribution chooses the MIG
slice each job runs on (`faas_gpu.policies.lalb_job_distribution`).
"""

from __future__ import annotations

import argparse
import logging
import socket
import uuid
from pathlib import Path

from faas_gpu import paths, tracing
from faas_gpu.contract.env import ETCD_CREDENTIALS
from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.models import ModelStore
from faas_gpu.policies.protean.classes import BE_MAX_WAIT_S, BE_SHARE
from faas_gpu.serving import OneWorkerServer

log = logging.getLogger("scheduler")


class _Daemon:
    """Built inside the gunicorn worker: the scheduler, its leader election, and the API."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.parts: tuple = ()

    def load(self):
        tracing.configure("faas-gpu-scheduler")  # in the worker: the SDK's export thread does not survive a fork
        from faas_gpu.schedulers import Announcement

        from .api import create_app
        from .core import Scheduler
        from .leader import LeaderElection

        a = self.args
        token = ensure_token(a.home / "secrets")
        ds = open_datastore(
            a.etcd,
            paths.state_db(a.home),
            cluster_token=token,  # records sealed and checked (`faas_gpu.datastore.sealed`)
            credentials_file=a.etcd_credentials,
            secrets_dir=a.home / "secrets",
        )
        distributor = None
        if a.distribution == "protean":
            from faas_gpu.policies.protean.distribution import job_distributor

            distributor = job_distributor(self._assumptions())  # the paper's Alg. 1 and Eq. 2
        scheduler = Scheduler(
            ds,
            ModelStore(a.home / "scheduler-models", a.max_model_bytes),
            token,
            policy=a.policy,
            o3_limit=a.o3_limit,
            no_units_timeout_s=a.no_units_timeout,
            be_max_wait_s=a.be_max_wait,
            be_share=a.be_share,
            distributor=distributor,
        )
        identity = f"{a.advertise or a.bind}:{a.port}/{socket.gethostname()}/{uuid.uuid4().hex[:6]}"
        host = a.advertise or ("127.0.0.1" if a.bind in ("0.0.0.0", "::") else a.bind)
        announcement = Announcement(ds, identity, f"http://{host}:{a.port}", ttl_s=a.leader_ttl)
        election = LeaderElection(ds, identity, ttl_s=a.leader_ttl, announcement=announcement)
        election.step()
        election.start()
        scheduler.start()
        self.parts = (scheduler, election)
        reconfig = self._reconfigurator(scheduler, token, election) if a.reconfigure else None
        log.info(
            "scheduler %s started (%s; distribution: %s)",
            identity,
            "leader" if election.is_leader.is_set() else "follower",
            a.distribution,
        )
        return create_app(scheduler, election, token, reconfig=reconfig)

    def _assumptions(self):
        """PROTEAN's assumptions file (`--protean-assumptions`, else the package's)."""
        from faas_gpu.policy_data.protean import default_assumptions, parse_assumptions

        path = self.args.protean_assumptions
        return parse_assumptions(path.read_text()) if path else default_assumptions()

    def _reconfigurator(self, scheduler, token: str, election):
        from concurrent.futures import ThreadPoolExecutor

        from faas_gpu.policies.protean.reconfigurator import reconfigurator_from_assumptions

        from .reconfigure import ReconfigController

        a = self.args
        controller = ReconfigController(
            scheduler,
            reconfigurator_from_assumptions(self._assumptions()),
            token,
            interval_s=a.monitor_interval,
            drain_timeout_s=a.reconfig_drain_timeout,
            is_leader=election.is_leader.is_set,
            executor=ThreadPoolExecutor(4, thread_name_prefix="reconfigure"),
        )
        controller.start()
        self.parts = (*self.parts, controller)
        log.info("GPU Reconfigurator on: MIG %s GPUs, every %gs", controller.gpu_model.name, a.monitor_interval)
        return controller

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
    p.add_argument("--etcd-credentials", type=Path, help=ETCD_CREDENTIALS.doc)
    p.add_argument("--policy", choices=["lb", "lalb", "lalb_o3"], default="lalb_o3")
    p.add_argument("--o3-limit", type=int, default=25)
    p.add_argument("--leader-ttl", type=int, default=3)
    p.add_argument(
        "--no-units-timeout", type=float, default=10.0, help="fail queued jobs (503) after this long with no unit"
    )
    p.add_argument(
        "--be-max-wait",
        type=float,
        default=BE_MAX_WAIT_S,
        help="longest a best-effort job waits behind strict ones (s)",
    )
    p.add_argument(
        "--be-share",
        type=float,
        default=BE_SHARE,
        help="past --be-max-wait, the share of admissions best-effort jobs take while strict ones wait (0-1]",
    )
    p.add_argument(
        "--reconfigure",
        action="store_true",
        help="PROTEAN's GPU Reconfigurator: the leader re-slices MIG GPUs (off: CPU/sim back ends have no MIG)",
    )
    p.add_argument(
        "--distribution",
        choices=["off", "protean"],
        help="PROTEAN's Job Distribution (Alg. 1) chooses the MIG slice of each job with a known model "
        "(default: protean with --reconfigure, off without)",
    )
    p.add_argument("--monitor-interval", type=float, default=1.0, help="with --reconfigure: Alg. 2's W (s)")
    p.add_argument(
        "--reconfig-drain-timeout",
        type=float,
        default=10.0,
        help="with --reconfigure: how long a manager waits for a GPU's running jobs before refusing (s)",
    )
    p.add_argument(
        "--protean-assumptions",
        type=Path,
        help="with --reconfigure or --distribution protean: PROTEAN's assumptions file "
        "(models, GPU, thresholds; default: the package's)",
    )
    p.add_argument("--max-model-bytes", type=int, default=2 * 1024**3)
    p.add_argument("--threads", type=int, default=64)
    args = p.parse_args(argv)
    if args.monitor_interval <= 0:
        p.error("--monitor-interval: must be > 0")
    if args.be_max_wait <= 0:
        p.error("--be-max-wait: must be > 0")
    if not 0 < args.be_share <= 1:
        p.error("--be-share: must be in (0, 1]")
    if args.distribution is None:
        args.distribution = "protean" if args.reconfigure else "off"
    if args.home is None:
        from faas_gpu import paths

        args.home = paths.home()
    args.home = args.home.resolve()
    args.etcd_credentials = args.etcd_credentials or ETCD_CREDENTIALS.read()
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    paths.private_umask()  # state, logs and replicas' files: 0700 / 0600, like the secrets
    daemon = _Daemon(args)
    OneWorkerServer(
        [f"{args.bind}:{args.port}"], daemon.load, daemon.close, threads=args.threads, timeout_s=600, name="scheduler"
    ).run()
    return 0
