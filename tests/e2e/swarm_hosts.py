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
            if subprocess.run(
                ["docker", "-H", self.sock, "version"],
                capture_output=True,
                env={**os.environ, "DOCKER_API_VERSION": "1.41"},
            ).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError((d / "dockerd.log").read_text()[-2000:])

    def docker(self, *args: str, timeout: float = 600) -> str:
        env = {**os.environ, "DOCKER_API_VERSION": "1.41"}
        done = subprocess.run(["docker", "-H", self.sock, *args], capture_output=True, text=True, env=env, timeout=timeout)
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
                self.manager.sh("python3", "-c", f"import urllib.request; urllib.request.urlopen('http://{REGISTRY}/v2/')")
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
