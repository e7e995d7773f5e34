"""The faas-gpu stack across a test Swarm (tests/docker_hosts.py): the layer the cluster test and
benchmarks/cluster.py stand on.

- On the manager (10.77.0.1), as processes in its namespace: etcd, the scheduler and the gateway +
  provider on `--runtime swarm` (its engine: the manager's dockerd), all from this checkout.
- On every worker labelled gpu=true: a GPU Manager as a Swarm *global* service of
  `faas-gpu/base` (pulled from the manager's registry) constrained to `node.labels.gpu==true`, on
  the node's host network, announcing the node's 10.77 address in etcd; the cluster token a Swarm
  secret. `manager_mode="process"` runs the same daemon as a process in the worker's namespace
  instead (the benchmark's 1-host / 2-host comparison starts the second one mid-run).
- etcd with its authentication on (`faas-gpu datastore enable-auth`, run on the manager once etcd
  answers): the daemons' login is a file in each one's secrets/ (the GPU Managers' service: a
  Swarm secret beside the cluster token), as deploy/ hands it; no daemon's command line holds it.

Why the stack's own daemons (etcd, scheduler, gateway) stay processes: the gateway needs the
manager's engine socket and the checkout's code under test, and etcd has no image here; the GPU
Managers are the part that must be on every GPU node, which is what a global service is for.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from tests.docker_hosts import REGISTRY, SUBNET, DockerHost, Swarm

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
MANAGER_ADDR = f"{SUBNET}.1"
GATEWAY = f"http://{MANAGER_ADDR}:8080"
SCHEDULER = f"http://{MANAGER_ADDR}:8091"
ETCD = f"http://{MANAGER_ADDR}:2379"
GPU_MANAGER_SERVICE = "faas-gpu-gpu-manager"
TOKEN_SECRET = "faas-gpu-cluster-token"
ETCD_LOGIN_SECRET = "faas-gpu-etcd-credentials"
BASE_IMAGE = "faas-gpu/base:latest"

# The node's own address, as the scheduler reaches it: the source address of a route to the manager.
_SELF_ADDRESS = (
    'python -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); '
    f"s.connect(('{MANAGER_ADDR}', 9)); print(s.getsockname()[0])\""
)


def wait_http(host: DockerHost, url: str, log: Path | None, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if host.call(requests.get, url, timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{url} did not answer in {timeout_s} s:\n{tail}")


class ClusterStack:
    """etcd, the scheduler and the gateway on the manager; GPU Managers on the gpu workers (see
    the module docstring). `stop()` stops what it started (the hosts belong to the Swarm)."""

    def __init__(
        self,
        swarm: Swarm,
        *,
        backend: str = "cpu",
        units: int = 2,
        manager_args: tuple[str, ...] = (),
        manager_mode: str = "service",
        manager_hosts: list[DockerHost] | None = None,
        max_inflight: int = 64,
    ):
        self.swarm = swarm
        self.call_log: list[tuple] = []  # calls_through_node_loss's (sent at s, took s, outcome, why not 200)
        self.root = Path(tempfile.mkdtemp(prefix="fgs-"))
        self.token = secrets.token_urlsafe(32)
        self.etcd_login = f"faas-gpu:{secrets.token_urlsafe(24)}"  # the daemons' etcd user
        self.backend, self.units, self.manager_args = backend, units, manager_args
        self.procs: list[subprocess.Popen] = []
        self.managers: dict[str, subprocess.Popen] = {}
        self.home = self._home("provider")
        m = swarm.manager
        try:
            self._start(m, "etcd", [
                "etcd", "--data-dir", str(self.root / "etcd"), "--listen-client-urls", ETCD,
                "--advertise-client-urls", ETCD, "--listen-peer-urls", f"http://{MANAGER_ADDR}:2380",
            ])  # fmt: skip
            wait_http(m, f"{ETCD}/health", self.root / "etcd.log")
            auth_env = {**os.environ, "FAAS_GPU_HOME": str(self._home("etcd-auth")), "PYTHONPATH": str(REPO)}
            m.run(
                [PYTHON, "-m", "faas_gpu.cli", "datastore", "enable-auth", "--etcd", ETCD,
                 "--credentials", str(self.home / "secrets" / "etcd-credentials")],
                cwd=REPO, timeout=180, env=auth_env,
            )  # fmt: skip
            self.scheduler_log = self._start(m, "scheduler", [
                PYTHON, "-m", "scheduler", "--home", str(self._home("scheduler")), "--bind", MANAGER_ADDR,
                "--port", "8091", "--etcd", ETCD, "--leader-ttl", "2",
            ])  # fmt: skip
            wait_http(m, f"{SCHEDULER}/healthz", self.scheduler_log)
            hosts = swarm.workers if manager_hosts is None else manager_hosts
            if manager_mode == "service":
                self.start_manager_service()
            else:
                for w in hosts:
                    self.start_manager_process(w)
            self.provider_log = self._start(m, "provider", [
                PYTHON, "-m", "provider.server", "--home", str(self.home), "--bind", "0.0.0.0",
                "--gateway-port", "8080", "--provider-port", "8081", "--metrics-port", "0",
                "--runtime", "swarm", "--docker-host", m.base_url, "--scheduler", SCHEDULER, "--etcd", ETCD,
                "--max-inflight-per-function", str(max_inflight),
            ], env={"FAAS_GPU_HOME": str(self.home), "upstream_timeout": "150s"})  # fmt: skip
            wait_http(m, f"{GATEWAY}/healthz", self.provider_log)
        except BaseException:
            self.stop()
            raise

    # -- processes on a host ---------------------------------------------------------------
    def _home(self, name: str) -> Path:
        home = self.root / name
        (home / "secrets").mkdir(parents=True, exist_ok=True)
        for name, value in (("gpu-manager-token", self.token), ("etcd-credentials", self.etcd_login)):
            path = home / "secrets" / name
            path.write_text(value)
            os.chmod(path, 0o600)
        return home

    def _start(self, host: DockerHost, name: str, argv: list[str], env: dict[str, str] | None = None) -> Path:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            proc = host.popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            )  # fmt: skip
        host.keep.add(proc.pid)  # survives a stop_dockerd of its host (the manager's are never stopped)
        self.procs.append(proc)
        return log

    def _gpu_manager_argv(self, node: str, advertise: str) -> list[str]:
        return [
            "python", "-m", "gpu_manager", "--bind", "0.0.0.0", "--advertise", advertise, "--port", "8090",
            "--node", node, "--etcd", ETCD, "--backend", self.backend, "--units", str(self.units),
            "--unit-memory-mb", "256", *self.manager_args,
        ]  # fmt: skip

    def start_manager_process(self, w: DockerHost) -> None:
        """A GPU Manager as a process in `w`'s namespace (this checkout's code)."""
        argv = self._gpu_manager_argv(w.name, w.address or "")
        argv[0] = PYTHON
        argv[argv.index("--bind") + 1] = w.address or "0.0.0.0"
        home = self._home(f"gpu-manager-{w.name}")
        argv += ["--home", str(home)]
        log = self._start(w, f"gpu-manager-{w.name}", argv)
        self.managers[w.name] = self.procs[-1]
        wait_http(w, f"http://{w.address}:8090/healthz", log)

    def kill_manager_process(self, w: DockerHost) -> None:
        p = self.managers.pop(w.name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)

    # -- the GPU Managers as a Swarm global service ------------------------------------------
    def start_manager_service(self, image: str | None = None) -> None:
        """`faas-gpu-gpu-manager`: mode global, `node.labels.gpu==true`, host network, the node's
        hostname as its --node, the cluster token a Swarm secret; waits until each gpu node's
        manager answers."""
        from docker.types import (
            ContainerSpec,
            EndpointSpec,
            Placement,
            RestartPolicy,
            SecretReference,
            ServiceMode,
            TaskTemplate,
        )

        m = self.swarm.manager
        image = image or getattr(self.swarm, "base_image", None) or f"{REGISTRY}/{BASE_IMAGE}"
        api = m.client.api
        secret = api.create_secret(TOKEN_SECRET, self.token.encode())
        login = api.create_secret(ETCD_LOGIN_SECRET, self.etcd_login.encode())
        argv = self._gpu_manager_argv("$NODE", "$(" + _SELF_ADDRESS + ")")
        script = (
            'mkdir -p "$FAAS_GPU_HOME/secrets" && cp /run/secrets/gpu-manager-token "$FAAS_GPU_HOME/secrets/" && '
            'cp /run/secrets/etcd-credentials "$FAAS_GPU_HOME/secrets/" && '
            "exec " + " ".join(a if a.startswith("$") else f"'{a}'" for a in argv)
        )
        container = ContainerSpec(
            image, ["sh", "-c", script],
            env={"NODE": "{{.Node.Hostname}}", "FAAS_GPU_HOME": "/tmp/faas-gpu", "PYTHONUNBUFFERED": "1"},
            secrets=[
                SecretReference(secret["ID"], TOKEN_SECRET, filename="gpu-manager-token"),
                SecretReference(login["ID"], ETCD_LOGIN_SECRET, filename="etcd-credentials"),
            ],
            stop_grace_period=int(2e9),
        )  # fmt: skip
        api.create_service(
            TaskTemplate(
                container, placement=Placement(constraints=["node.labels.gpu==true"]),
                restart_policy=RestartPolicy(condition="any", delay=int(1e9)), networks=["host"],
            ),
            name=GPU_MANAGER_SERVICE, mode=ServiceMode("global"), endpoint_spec=EndpointSpec(mode="dnsrr"),
        )  # fmt: skip
        gpu_nodes = [w for w in self.swarm.workers if self.swarm.node(w).attrs["Spec"].get("Labels", {}).get("gpu")]
        for w in gpu_nodes:
            wait_http(w, f"http://{w.address}:8090/healthz", None, timeout_s=240)

    def manager_service_hosts(self) -> dict[str, int]:
        """Running GPU Manager tasks per host name (the global service's placement)."""
        return self.swarm.tasks_by_host(self.swarm.manager.client.services.get(GPU_MANAGER_SERVICE))

    # -- what tests read -------------------------------------------------------------------
    @property
    def auth(self) -> tuple[str, str]:
        s = self.home / "secrets"
        return (s / "basic-auth-user").read_text().strip(), (s / "basic-auth-password").read_text().strip()

    def cli(self, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        """`faas-gpu <args>` run on the manager (as a user there does), against its gateway."""
        return self.swarm.manager.run(
            [PYTHON, "-m", "faas_gpu.cli", *args], check=False, cwd=cwd, timeout=timeout,
            env={**os.environ, "FAAS_GPU_HOME": str(self.home), "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    def scheduler_units(self) -> list[str]:
        headers = {"Authorization": f"Bearer {self.token}"}
        st = self.swarm.manager.call(requests.get, f"{SCHEDULER}/v1/status", headers=headers, timeout=5)
        return sorted(st.json()["units"])

    def function_status(self, name: str, usage: bool = False) -> dict[str, Any]:
        params = {"usage": "1"} if usage else None
        r = self.swarm.manager.call(
            requests.get, f"{GATEWAY}/system/function/{name}", params=params, auth=self.auth, timeout=10
        )
        return r.json() if r.status_code == 200 else {}

    def wait_available(self, name: str, n: int, timeout_s: float = 180) -> dict[str, Any]:
        deadline, st = time.monotonic() + timeout_s, {}
        while time.monotonic() < deadline:
            st = self.function_status(name)
            if st.get("availableReplicas", 0) >= n:
                return st
            time.sleep(0.3)
        raise AssertionError(f"{name}: {st}\n{self.provider_log.read_text(errors='replace')[-3000:]}")

    def function_hosts(self, name: str) -> dict[str, str]:
        """The function's services with a running task -> the host name it runs on."""
        names = {self.swarm.node_id(h): h.name for h in self.swarm.hosts if h._client is not None}
        out = {}
        api = self.swarm.manager.client.api
        for svc in api.services(filters={"label": f"com.openfaas.function={name}"}):
            for t in api.tasks(filters={"service": svc["ID"], "desired-state": "running"}):
                if t["Status"]["State"] == "running":
                    out[svc["Spec"]["Name"]] = names.get(t.get("NodeID", ""), t.get("NodeID", "?"))
        return out

    def calls_through_node_loss(
        self, lost: DockerHost, seconds: float, lose_after_s: float, name: str = "classify", callers: int = 4
    ) -> Counter:
        """`callers` threads (in the manager's namespace) calling `name` through the gateway for
        `seconds`, `lost`'s dockerd stopped `lose_after_s` in (its replica and GPU Manager go with
        it): every call's outcome, its status code or the name of the exception it raised."""
        outcomes: Counter = Counter()
        lock = threading.Lock()
        # every replica warm first (its first call exports, uploads and loads the model: seconds
        # here), so that the window counts calls of a serving function, not its cold starts
        with cf.ThreadPoolExecutor(2 * callers) as pool:
            warm = [
                pool.submit(self.swarm.manager.call, requests.post, f"{GATEWAY}/function/{name}",
                            json={"seed": i}, timeout=120)
                for i in range(2 * callers)
            ]  # fmt: skip
            cold = [f.result().status_code for f in warm]
        assert cold == [200] * len(cold), f"warming {name}: {cold}"
        stop = time.monotonic() + seconds

        def caller(seed: int) -> None:
            s = requests.Session()
            while time.monotonic() < stop:
                sent, why = time.monotonic(), ""
                try:
                    r = s.post(f"{GATEWAY}/function/{name}", json={"seed": seed}, timeout=120)
                    code, why = r.status_code, ("" if r.status_code == 200 else r.text[:300])
                except requests.RequestException as exc:
                    code = type(exc).__name__
                with lock:
                    outcomes[code] += 1
                    took = round(time.monotonic() - sent, 3)
                    self.call_log.append((round(sent - stop + seconds, 2), took, code, why))

        with cf.ThreadPoolExecutor(callers) as pool:
            futs = [pool.submit(self.swarm.manager.call, caller, i) for i in range(callers)]
            time.sleep(lose_after_s)
            lost.stop_dockerd()
            for f in futs:
                f.result()
        return outcomes

    def wait_units_gone(self, host: DockerHost, timeout_s: float = 60) -> bool:
        """Whether the scheduler dropped every unit of `host` within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while any(u.startswith(f"{host.name}/") for u in self.scheduler_units()):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def diagnose(self, chars: int = 2500) -> str:
        """The tails of the stack's logs and of the GPU Managers' and functions' service logs
        (for a failing assertion's message)."""
        out = []
        for log in sorted(self.root.glob("*.log")):
            out.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        try:
            api = self.swarm.manager.client.api
            for svc in api.services():
                text = b"".join(api.service_logs(svc["ID"], stdout=True, stderr=True, tail=30, timestamps=True))
                out.append(f"--- service {svc['Spec']['Name']}\n{text.decode(errors='replace')[-chars:]}")
        except Exception as exc:  # noqa: BLE001 — a diagnosis must not raise
            out.append(f"(service logs: {exc})")
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(30)
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)


def build_classify(swarm: Swarm, project: Path, home: Path) -> str:
    """`faas-gpu build --docker --push` of the classify project (the template's Dockerfile on
    faas-gpu/base) on the manager's engine, pushed to the manager's registry; the image name."""
    done = swarm.manager.run(
        [PYTHON, "-m", "faas_gpu.cli", "build", "-f", "stack.yml", "--docker", "--push",
         "--docker-host", swarm.manager.base_url, "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"],
        check=False, cwd=project, timeout=900,
        env={**os.environ, "FAAS_GPU_HOME": str(home), "PYTHONPATH": str(REPO), "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"faas-gpu build --docker --push: {done.stdout[-2000:]}{done.stderr[-3000:]}")
    return f"{REGISTRY}/classify:latest"
