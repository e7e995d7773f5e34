"""`python -m gpu_manager`: the per-node GPU Manager daemon (gunicorn gthread, one worker).

It discovers its units (NVML for `cuda`, emulated ones for `cpu`), serves the job API, and
every second reports each unit's status into the datastore under a lease, so a dead manager's
units vanish from the scheduler's view by themselves. On `cuda` it also changes MIG geometries
(`POST /v1/gpus/<index>/geometry`) and, with `--mps`, runs an MPS control daemon per unit.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import threading
from pathlib import Path

from faas_gpu import paths, tracing
from faas_gpu.contract.env import ETCD_CREDENTIALS
from faas_gpu.contract.keys import UNITS
from faas_gpu.contract.keys import unit as unit_key
from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.mps import MPSError, thread_percentage
from faas_gpu.serving import OneWorkerServer

log = logging.getLogger("gpu-manager")
STATUS_PREFIX = UNITS  # where each unit's status goes (the scheduler reads the same key)


class StatusReporter:
    """Puts each unit's status under /faas-gpu/units/<node>/<unit>, attached to a lease.

    A draining unit (its GPU is being reconfigured) and a unit that is gone are taken out at
    once, so the scheduler stops placing jobs on them.
    """

    def __init__(self, manager, datastore, node: str, url: str, every_s: float = 1.0, ttl_s: int = 5):
        self.manager, self.ds, self.node, self.url = manager, datastore, node, url
        self.every_s, self.ttl_s = every_s, ttl_s
        self._stop = threading.Event()
        self._lease = None
        self._reported: set[str] = set()
        self._lock = threading.Lock()  # the status thread and a reconfiguration both report
        self._thread = threading.Thread(target=self._run, name="status", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def report(self) -> None:
        with self._lock:
            if self._lease is None:
                self._lease = self.ds.lease(self.ttl_s)
            else:
                try:
                    self._lease.refresh()
                except ValueError:  # expired while the datastore was away: take a new one
                    self._lease = self.ds.lease(self.ttl_s)
            keys = set()
            for unit in self.manager.status():
                if unit["state"] == "draining":
                    continue
                key = unit_key(self.node, unit["unit"])
                body = {**unit, "node": self.node, "url": self.url}
                self.ds.put(key, json.dumps(body), lease=self._lease)
                keys.add(key)
            for key in self._reported - keys:
                self.ds.delete(key)
            self._reported = keys

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.report()
            except Exception as exc:  # the datastore restarting must not stop the manager
                log.warning("status report failed: %s", exc)
                with self._lock:
                    self._lease = None

    def stop(self) -> None:
        self._stop.set()


class _Daemon:
    """Built inside the gunicorn worker: the manager, its status reporter, and the API."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.manager = None
        self.reporter = None

    def load(self):
        tracing.configure("faas-gpu-gpu-manager")  # in the worker: the SDK's export thread does not survive a fork
        from faas_gpu.models import ModelStore

        from .api import create_app
        from .discovery import cpu_units, discover_units, gpu_count
        from .isolation import checked, worker_walls
        from .manager import GPUManager
        from .mps import MPSControl
        from .pool import host_share_mb

        a = self.args
        home = a.home
        units = discover_units() if a.backend in ("cuda", "auto") else []
        gpus = gpu_count() if a.backend in ("cuda", "auto") else 0
        if a.backend == "auto":  # GPUs when NVML finds some, else emulated units on the CPU
            a.backend = "cuda" if gpus else "cpu"
        if a.backend in ("cpu", "sim"):
            units = cpu_units(a.units, a.unit_memory_mb)
        if not gpus and not units:
            raise SystemExit("gpu-manager: the cuda back end found no GPU units (try --backend cpu)")
        if a.mps and a.backend != "cuda":
            raise SystemExit(f"gpu-manager: --mps needs the cuda back end, not {a.backend}")
        if not units:  # MIG on with no instances yet: sliced through POST /v1/gpus/<index>/geometry
            log.warning("gpu-manager: %d GPU(s) but no unit yet (MIG on, no GPU instance)", gpus)
        walls = None
        if a.backend in ("cpu", "cuda"):  # the sim back end starts no process that reads an artifact
            mps_dir = home / "mps" if a.mps else None
            if mps_dir is not None:
                mps_dir.mkdir(exist_ok=True)  # shown to the workers, as it is, from their start
            walls = worker_walls(home, home / "models", mps_dir, a.worker_sandbox, a.worker_user)
            walls, _ = checked(walls, a.worker_sandbox)
        reader_gid = walls.gid if walls is not None and walls.uid is not None else None
        store = ModelStore(home / "models", a.max_model_bytes, reader_gid=reader_gid)
        factory = None
        if a.backend == "sim":
            from .sim_backend import Profile, SimWorker

            if not a.sim_profile:
                raise SystemExit("gpu-manager: --backend sim needs --sim-profile (an INFless profile file)")
            profile = Profile.from_infless(a.sim_profile, a.sim_threads, a.sim_sm)
            factory = lambda _artifact, _device, **_env: SimWorker(profile, a.sim_load_s)  # noqa: E731
        nvml = None
        if a.backend == "cuda":
            import pynvml as nvml
        mps = MPSControl(home / "mps") if a.mps else None
        self.manager = GPUManager(
            units,
            store,
            threads_per_worker=a.worker_threads,
            worker_factory=factory,
            nvml=nvml,
            mps=mps,
            mps_thread_percentage=a.mps_thread_percentage,
            warm_workers=a.warm_workers,
            max_workers_per_unit=a.max_workers_per_unit,
            charge_measured_cpu=a.charge_measured_memory,
            prepared_mb=host_share_mb(0.25) if a.prepared_mb is None else a.prepared_mb,
            parsed_programs=a.parsed_programs,
            optimize=a.optimize,
            walls=walls,
        )
        try:
            self.manager.start_mps()
        except MPSError as exc:
            self.manager.close()
            raise SystemExit(f"gpu-manager: {exc}") from None
        token = ensure_token(home / "secrets")
        datastore = open_datastore(
            a.etcd,
            paths.state_db(home),
            cluster_token=token,  # records sealed and checked (`faas_gpu.datastore.sealed`)
            credentials_file=a.etcd_credentials or ETCD_CREDENTIALS.read(),
            secrets_dir=home / "secrets",
        )
        url = f"http://{a.advertise or a.bind}:{a.port}"
        self.reporter = StatusReporter(self.manager, datastore, a.node, url)
        self.manager.on_units_changed.append(self.reporter.report)
        self.reporter.start()
        log.info("gpu-manager %s serving %d %s unit(s) on %s", a.node, len(units), a.backend, url)
        return create_app(self.manager, token)

    def close(self) -> None:
        if self.reporter:
            self.reporter.stop()
        if self.manager:
            self.manager.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu-manager", description=__doc__)
    p.add_argument("--home", type=Path, default=None, help="state folder (default $FAAS_GPU_HOME or ./.faas-gpu)")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--advertise", help="host the scheduler reaches this manager at (default: --bind)")
    p.add_argument("--node", default=socket.gethostname())
    p.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda", "sim"],
        default="auto",
        help="auto: cuda when NVML finds GPUs, else cpu (emulated units)",
    )
    p.add_argument(
        "--sim-profile", type=Path, help="sim back end: an INFless profile file (model threads sm%% batch ms)"
    )
    p.add_argument("--sim-threads", type=int, default=8, help="sim back end: the profile's CPU threads")
    p.add_argument("--sim-sm", type=int, default=50, help="sim back end: the profile's GPU SM share (%%)")
    p.add_argument("--sim-load-s", type=float, default=0.5, help="sim back end: model loading time")
    p.add_argument("--units", type=int, default=2, help="emulated units (cpu back end)")
    p.add_argument("--unit-memory-mb", type=float, default=2048, help="memory budget per emulated unit")
    p.add_argument("--worker-threads", type=int, default=1, help="torch threads per model worker")
    p.add_argument(
        "--no-optimize",
        dest="optimize",
        action="store_false",
        help="cpu back end: serve models exactly as loaded, without the inference rewrites (conv-bn folding, "
        "channels-last weights, fused conv + relu) the workers otherwise make where they check out against the model",
    )
    p.add_argument(
        "--warm-workers",
        type=int,
        default=1,
        help="cpu and cuda back ends: idle model workers kept ready per unit (torch imported), so a cache "
        "miss skips a process start; 0: none",
    )
    p.add_argument(
        "--prepared-mb",
        type=float,
        default=None,
        help="cpu and cuda back ends: host memory for prepared workers, models read and checked ahead (on "
        "upload, and again when evicted from a unit) so their miss pays only the copy to the device and "
        "the warm-up; least recently used dropped first (default: 25%% of the node's memory; 0: none)",
    )
    p.add_argument(
        "--parsed-programs",
        type=int,
        default=8,
        help="cpu and cuda back ends: torch.export programs each idle worker holds parsed (without weights) "
        "for its unit, the most recently uploaded or loaded there, so a miss maps only the weights from the "
        "store; 0: none",
    )
    p.add_argument(
        "--mps",
        action="store_true",
        help="cuda back end: an MPS control daemon per unit (pipes under --home/mps); workers share units via MPS",
    )
    p.add_argument(
        "--mps-thread-percentage",
        type=thread_percentage,
        default=None,
        help="with --mps: each model worker's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (1-100; default: unlimited)",
    )
    p.add_argument(
        "--max-workers-per-unit",
        type=int,
        default=None,
        help="most model workers (cached models) per unit; with --mps also the MPS client limit "
        "(48 per GPU, scaled by a MIG slice's share); at the cap a load evicts the least recently used",
    )
    p.add_argument(
        "--charge-measured-memory",
        action="store_true",
        help="cpu back end: charge units each model's measured memory (its worker's growth) rather than "
        "its artifact's size (GPU units always are charged what was measured)",
    )
    p.add_argument(
        "--worker-sandbox",
        choices=["auto", "on", "off"],
        default="auto",
        help="model workers' walls (an unprivileged uid, no network, no view of the state folder, writes only to "
        "a private scratch, no_new_privs, seccomp): auto builds what this kernel allows and says what is missing; "
        "on refuses to start without all of them; off builds none",
    )
    p.add_argument(
        "--worker-user",
        type=_worker_user,
        default="64999:64999",
        help="UID[:GID] the model workers run as when the manager runs as root (not with --mps: MPS serves a client "
        "as its own uid)",
    )
    p.add_argument("--max-model-bytes", type=int, default=2 * 1024**3)
    p.add_argument("--etcd", help="etcd URL (default: the embedded datastore in --home)")
    p.add_argument("--etcd-credentials", type=Path, help=ETCD_CREDENTIALS.doc)
    p.add_argument("--threads", type=int, default=16)
    args = p.parse_args(argv)
    if args.home is None:
        from faas_gpu import paths

        args.home = paths.home()
    args.home = args.home.resolve()
    return args


def _worker_user(value: str) -> tuple[int, int]:
    from .isolation import parse_user

    try:
        return parse_user(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    paths.private_umask()  # state, logs and replicas' files: 0700 / 0600, like the secrets
    daemon = _Daemon(args)
    OneWorkerServer(
        [f"{args.bind}:{args.port}"], daemon.load, daemon.close, threads=args.threads, timeout_s=300, name="gpu-manager"
    ).run()
    return 0
