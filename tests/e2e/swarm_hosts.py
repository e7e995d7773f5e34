"""A three-host Docker Swarm made of network namespaces, for the cluster test and benchmark.

Stop-gap until h1's `tests/docker_hosts.py` (`swarm3`) lands, written to the same recipe: each
host a network namespace held by `unshare --net`, its own `dockerd` entered with `nsenter` (never
`ip netns exec`, which hides the cgroup mounts), a switch namespace with a bridge and one veth
pair per host on 10.77.0.0/24, `docker swarm init/join`, the workers labelled gpu=true, a
registry on the manager. No traffic leaves these namespaces. Everything started is stopped.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
REGISTRY = f"{SUBNET}.1:5000"


def _run(*argv: str, timeout: float = 60) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()[-800:]}")
    return done.stdout


class Host:
    def __init__(self, name: str, index: int, root: Path):
        self.name, self.addr = name, f"{SUBNET}.{index}"
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.holder = subprocess.Popen(["unshare", "--net", "--fork", "sleep", "infinity"], start_new_session=True)
        self.netns = f"/proc/{self.holder.pid}/ns/net"
        self.sock = f"unix://{self.dir}/docker.sock"
        self.dockerd: subprocess.Popen | None = None
        self.procs: list[subprocess.Popen] = []
        self.node_id = ""
        for _ in range(50):
            if os.readlink(self.netns) != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.02)

    def sh(self, *argv: str, timeout: float = 60) -> str:
        return _run("nsenter", f"--net={self.netns}", *argv, timeout=timeout)

    def popen(self, argv: list[str], log: Path, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen:
        """A process in this host's namespace (its own session, killed at stop)."""
        proc = subprocess.Popen(
            ["nsenter", f"--net={self.netns}", *argv],
            stdout=open(log, "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            **kw,
        )
        self.procs.append(proc)
        return proc

    def start_dockerd(self, insecure: str = REGISTRY) -> None:
        d = self.dir
        self.dockerd = self.popen(
            [
                "dockerd",
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                f"--data-root={d}/data",
                f"--exec-root={d}/x",
                f"--host={self.sock}",
                f"--pidfile={d}/docker.pid",
                f"--insecure-registry={insecure}",
            ],
            d / "dockerd.log",
        )
        for _ in range(300):
            if (
                subprocess.run(
                    ["docker", "-H", self.sock, "version"],
                    capture_output=True,
                    env={**os.environ, "DOCKER_API_VERSION": "1.41"},
                ).returncode
                == 0
            ):
                return
            time.sleep(0.1)
        raise RuntimeError((d / "dockerd.log").read_text()[-2000:])

    def docker(self, *args: str, timeout: float = 600) -> str:
        env = {**os.environ, "DOCKER_API_VERSION": "1.41"}
        done = subprocess.run(
            ["docker", "-H", self.sock, *args], capture_output=True, text=True, env=env, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} on {self.name}: {done.stderr.strip()[-800:]}")
        return done.stdout

    def client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.sock, version="auto", timeout=600)

    def stop_dockerd(self) -> None:
        """SIGTERM, as a host's shutdown does: the engine stops its containers (each watchdog drains)."""
        if self.dockerd is not None and self.dockerd.poll() is None:
            os.killpg(self.dockerd.pid, signal.SIGTERM)
            try:
                self.dockerd.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.dockerd.pid, signal.SIGKILL)

    def call(self, fn: Callable[[], Any]) -> Any:
        """fn() with sockets opened in this host's namespace (a thread that setns()es first)."""
        out: dict[str, Any] = {}

        def target() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(self.netns, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            try:
                out["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 — handed to the caller
                out["error"] = exc

        t = threading.Thread(target=target)
        t.start()
        t.join()
        if "error" in out:
            raise out["error"]
        return out["value"]

    def stop(self) -> None:
        self.stop_dockerd()
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(30)
        # containerd-shims left by a killed dockerd live in this namespace's session trees
        for pid_file in (self.dir / "x").rglob("init.pid") if (self.dir / "x").exists() else []:
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, OSError):
                pass
        if self.holder.poll() is None:
            os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait(10)
        # a dockerd that stopped (or was killed) leaves its network namespaces' bind mounts
        with open("/proc/mounts") as fh:
            mounts = [line.split()[1] for line in fh if line.split()[1].startswith(f"{self.dir}/")]
        for path in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", path], capture_output=True)


class Cluster:
    """manager (10.77.0.1, registry on :5000) + workers (10.77.0.2.., labelled gpu=true)."""

    def __init__(self, workers: int = 2):
        self.root = Path(tempfile.mkdtemp(prefix="fgc-", dir="/tmp"))
        self.switch = subprocess.Popen(["unshare", "--net", "--fork", "sleep", "infinity"], start_new_session=True)
        self.switch_ns = f"/proc/{self.switch.pid}/ns/net"
        time.sleep(0.1)
        self.hosts: list[Host] = []
        try:
            self._sw("ip", "link", "add", "br0", "type", "bridge")
            self._sw("ip", "link", "set", "br0", "up")
            for i, name in enumerate(["manager", *[f"worker{k + 1}" for k in range(workers)]], start=1):
                host = Host(name, i, self.root)
                self.hosts.append(host)
                self._sw("ip", "link", "add", f"s{i}", "type", "veth", "peer", "name", f"h{i}")
                self._sw("ip", "link", "set", f"s{i}", "master", "br0", "up")
                self._sw("ip", "link", "set", f"h{i}", "netns", str(host.holder.pid))
                host.sh("ip", "link", "set", "lo", "up")
                host.sh("ip", "link", "set", f"h{i}", "name", "eth0")
                host.sh("ip", "addr", "add", f"{host.addr}/24", "dev", "eth0")
                host.sh("ip", "link", "set", "eth0", "up")
            for h in self.hosts:
                h.start_dockerd()
            m = self.manager
            m.docker("swarm", "init", "--advertise-addr", m.addr)
            token = m.docker("swarm", "join-token", "-q", "worker").strip()
            for w in self.workers:
                w.docker("swarm", "join", "--token", token, f"{m.addr}:2377")
            for h in self.hosts:  # every host has the machine's hostname: nodes go by ID
                h.node_id = h.docker("info", "--format", "{{.Swarm.NodeID}}").strip()
            for w in self.workers:
                m.docker("node", "update", "--label-add", "gpu=true", "--label-add", f"host={w.name}", w.node_id)
            self._registry()
        except BaseException:
            self.stop()
            raise

    @property
    def manager(self) -> Host:
        return self.hosts[0]

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    def _sw(self, *argv: str) -> str:
        return _run("nsenter", f"--net={self.switch_ns}", *argv)

    def cut(self, host: Host) -> None:
        """The host's cable pulled: its veth end on the switch goes down."""
        self._sw("ip", "link", "set", f"s{self.hosts.index(host) + 1}", "down")

    def _registry(self) -> None:
        conf = self.root / "registry.yml"
        conf.write_text(
            "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: "
            f"{self.root}/registry\nhttp:\n  addr: {REGISTRY}\n"
        )
        self.manager.popen(["docker-registry", "serve", str(conf)], self.root / "registry.log")
        for _ in range(100):
            try:
                self.manager.sh(
                    "python3", "-c", f"import urllib.request; urllib.request.urlopen('http://{REGISTRY}/v2/')"
                )
                return
            except RuntimeError:
                time.sleep(0.1)
        raise RuntimeError((self.root / "registry.log").read_text()[-2000:])

    def stop(self) -> None:
        for h in reversed(self.hosts):
            try:
                h.stop()
            except Exception:  # noqa: BLE001 — stop the rest anyway
                pass
        if self.switch.poll() is None:
            os.killpg(self.switch.pid, signal.SIGKILL)
            self.switch.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


# -- the faas-gpu stack across the cluster's hosts -------------------------------------------------
PYTHON = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python")
REPO = str(Path(__file__).resolve().parents[2])
GATEWAY = f"http://{SUBNET}.1:8080"
SCHEDULER = f"http://{SUBNET}.1:8091"
ETCD = f"http://{SUBNET}.1:2379"


def _wait_http(host: Host, url: str, log: Path, timeout_s: float = 60) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if host.call(lambda: requests.get(url, timeout=1)).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer:\n{log.read_text()[-3000:] if log.exists() else ''}")


class ClusterStack:
    """etcd, the scheduler and the gateway (`--runtime swarm`) on the manager at 10.77.0.1; a GPU
    Manager on each worker as a process in that worker's namespace (not a Swarm global service:
    the stack's image is not needed for it that way; same daemons, same flags), all on one
    cluster token."""

    def __init__(
        self,
        cluster: Cluster,
        backend: str = "cpu",
        units: int = 2,
        manager_args: tuple[str, ...] = (),
        workers: list[Host] | None = None,
    ):
        self.cluster = cluster
        self.root = cluster.root / "stack"
        self.home = self.root / "provider"
        (self.home / "secrets").mkdir(parents=True)
        token = secrets_token()
        self.homes: dict[str, Path] = {}
        for name in ("provider", "scheduler", *[w.name for w in cluster.workers]):
            home = self.root / name
            (home / "secrets").mkdir(parents=True, exist_ok=True)
            (home / "secrets" / "gpu-manager-token").write_text(token)
            os.chmod(home / "secrets" / "gpu-manager-token", 0o600)
            self.homes[name] = home
        self.token = token
        m = cluster.manager
        env = {**os.environ, "PYTHONPATH": REPO}
        m.popen(
            [
                "etcd",
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                ETCD,
                "--advertise-client-urls",
                ETCD,
                "--listen-peer-urls",
                f"http://{SUBNET}.1:2380",
            ],
            self.root / "etcd.log",
        )
        _wait_http(m, f"{ETCD}/health", self.root / "etcd.log")
        self.scheduler_log = self.root / "scheduler.log"
        m.popen(
            [
                PYTHON,
                "-m",
                "scheduler",
                "--home",
                str(self.homes["scheduler"]),
                "--bind",
                f"{SUBNET}.1",
                "--port",
                "8091",
                "--etcd",
                ETCD,
                "--leader-ttl",
                "2",
            ],
            self.scheduler_log,
            env=env,
            cwd=REPO,
        )
        self.managers: dict[str, subprocess.Popen] = {}
        for w in cluster.workers if workers is None else workers:
            self.start_manager(w, backend, units, manager_args)
        _wait_http(m, f"{SCHEDULER}/healthz", self.scheduler_log)
        self.provider_log = self.root / "provider.log"
        m.popen(
            [
                PYTHON,
                "-m",
                "provider.server",
                "--home",
                str(self.home),
                "--bind",
                "0.0.0.0",
                "--gateway-port",
                "8080",
                "--provider-port",
                "8081",
                "--metrics-port",
                "0",
                "--runtime",
                "swarm",
                "--scheduler",
                SCHEDULER,
                "--etcd",
                ETCD,
                "--max-inflight-per-function",
                "64",
            ],
            self.provider_log,
            env={**env, "DOCKER_HOST": m.sock, "FAAS_GPU_HOME": str(self.home)},
            cwd=REPO,
        )
        _wait_http(m, f"{GATEWAY}/healthz", self.provider_log)

    def start_manager(self, w: Host, backend: str, units: int, args: tuple[str, ...] = ()) -> None:
        log = self.root / f"gpu-manager-{w.name}.log"
        self.managers[w.name] = w.popen(
            [
                PYTHON,
                "-m",
                "gpu_manager",
                "--home",
                str(self.homes[w.name]),
                "--bind",
                w.addr,
                "--port",
                "8090",
                "--node",
                w.name,
                "--etcd",
                ETCD,
                "--backend",
                backend,
                "--units",
                str(units),
                "--unit-memory-mb",
                "256",
                *args,
            ],
            log,
            env={**os.environ, "PYTHONPATH": REPO},
            cwd=REPO,
        )
        _wait_http(w, f"http://{w.addr}:8090/healthz", log)

    def kill_manager(self, w: Host) -> None:
        p = self.managers.pop(w.name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)

    @property
    def auth(self) -> tuple[str, str]:
        s = self.home / "secrets"
        return (s / "basic-auth-user").read_text().strip(), (s / "basic-auth-password").read_text().strip()

    def cli(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        """`faas-gpu <args>` run on the manager (as a user there does), against its gateway."""
        m = self.cluster.manager
        return subprocess.run(
            ["nsenter", f"--net={m.netns}", PYTHON, "-m", "faas_gpu.cli", *args],
            cwd=cwd,
            env={**os.environ, "FAAS_GPU_HOME": str(self.home), "PYTHONPATH": REPO},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def scheduler_units(self) -> list[str]:
        import requests

        auth = {"Authorization": f"Bearer {self.token}"}
        st = self.cluster.manager.call(lambda: requests.get(f"{SCHEDULER}/v1/status", headers=auth, timeout=5))
        return st.json()["units"]

    def manager_jobs(self, w: Host) -> dict[str, int]:
        import requests

        auth = {"Authorization": f"Bearer {self.token}"}
        return w.call(lambda: requests.get(f"http://{w.addr}:8090/v1/functions", headers=auth, timeout=5)).json()


def secrets_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


def watchdog_image(host: Host, tag: str, fprocess: str = "cat", mode: str = "streaming") -> None:
    """A function image with only Python and the template's watchdog (no faas-gpu, no torch):
    Debian's root file system and the classic watchdog, for what needs a real container replica
    but no model."""
    ctx = Path(tempfile.mkdtemp(prefix="fgc-img-"))
    try:
        tpl = Path(REPO) / "templates" / "python3-gpu"
        shutil.copy(tpl / "fwatchdog.py", ctx)
        shutil.copytree(
            tpl / "faas_gpu_watchdog", ctx / "faas_gpu_watchdog", ignore=shutil.ignore_patterns("__pycache__")
        )
        (ctx / "Dockerfile").write_text(
            "FROM faas-gpu-test/bookworm:latest\nWORKDIR /home/app\nCOPY fwatchdog.py ./\n"
            "COPY faas_gpu_watchdog/ faas_gpu_watchdog/\n"
            f'ENV fprocess="{fprocess}" mode="{mode}" PYTHONUNBUFFERED=1\nCMD ["python3", "fwatchdog.py"]\n'
        )
        if "faas-gpu-test/bookworm" not in host.docker("images", "--format", "{{.Repository}}"):
            host.docker("import", "/tmp/base-bookworm.tar", "faas-gpu-test/bookworm:latest")
        env = {**os.environ, "DOCKER_API_VERSION": "1.41", "DOCKER_BUILDKIT": "0"}
        subprocess.run(
            ["docker", "-H", host.sock, "build", "-q", "-t", tag, str(ctx)],
            check=True,
            env=env,
            capture_output=True,
            timeout=300,
        )
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
