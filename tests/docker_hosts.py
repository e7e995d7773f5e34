"""Test hosts with a real Docker Engine each, in network namespaces the test makes itself.

Why: the Docker and Swarm runtimes must be tested against a real `dockerd`, and a cluster needs
several hosts, but no test may send traffic outside its own namespaces (and no registry is reachable).

- `DockerHost`: a network namespace held by an `unshare --net --fork` process (loopback up), a
  `dockerd` entered into it with `nsenter --net` (never `ip netns exec`, which remounts /sys and
  hides the cgroups), with its own data root, exec root and socket under a short /tmp/fgd-* folder,
  `--bridge=none --iptables=false --ip6tables=false`. Containers use `network_mode="host"`: the host
  is the namespace. `client` is a docker SDK client on the socket; `call(fn)` runs `fn` in a thread
  that has entered the namespace, so its sockets (requests, a redis client, ...) talk to the host's
  127.0.0.1 and 10.77.0.N; `popen(argv)` starts a process in it.
- `Switch`: a namespace with a Linux bridge; `connect(host)` gives the host an `eth0` on
  10.77.0.N/24 over a veth pair created inside the switch namespace (so no name in the root
  namespace can collide with another test's); `cut(host)` takes the link down, `restore(host)` up.
- `Swarm`: hosts joined in one Swarm (`--advertise-addr` their 10.77 address), worker labels, and a
  `docker-registry` on the manager at 10.77.0.1:5000 (every dockerd trusts it as insecure).

Everything started here is stopped by `stop()`: dockerd, then every process left in the host's
namespace (containerd-shims, containers on the host network, the registry), the holder, the
mounts under the host's folder, and the folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker

CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
REGISTRY_PORT = 5000
REGISTRY = f"{SUBNET}.1:{REGISTRY_PORT}"
"""The manager's registry, as image names spell it (`10.77.0.1:5000/faas-gpu/base:latest`)."""
REQUIRED_TOOLS = ("dockerd", "containerd", "runc", "unshare", "nsenter", "ip")

T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def missing_tools(extra: tuple[str, ...] = ()) -> list[str]:
    """The programs a test host needs that this machine lacks (and 'root' when not root)."""
    missing = [tool for tool in (*REQUIRED_TOOLS, *extra) if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (namespaces and dockerd need it)")
    return missing


def _netns_link(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


class Namespace:
    """A network namespace (and a UTS one, so `hostname` is the host's name: Swarm names its nodes
    by it) held by `unshare --net --uts --fork sleep` (loopback up)."""

    def __init__(self, name: str):
        self.name = name
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--uts", "--fork", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        mine = _netns_link(os.getpid())
        deadline = time.monotonic() + 10
        while _netns_link(self.holder.pid) == mine:  # unshare(2) not done yet
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: unshare --net did not make a namespace")
            time.sleep(0.01)
        self.ns_path = f"/proc/{self.holder.pid}/ns/net"
        self.ns_id = _netns_link(self.holder.pid)
        self.sh(f"ip link set lo up && hostname {name}")

    @property
    def pid(self) -> int:
        return self.holder.pid

    def argv(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net={self.ns_path}", f"--uts=/proc/{self.holder.pid}/ns/uts", *argv]

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside the namespace (stdin closed unless given)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.argv(argv), **kwargs)

    def run(self, argv: list[str], check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run `argv` inside the namespace to its end; output captured as text."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        done = subprocess.run(self.argv(argv), **kwargs)
        if check and done.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)} failed ({done.returncode}): {done.stderr}")
        return done

    def sh(self, script: str) -> str:
        return self.run(["sh", "-c", script]).stdout

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in a thread that entered this namespace: its sockets live here
        (and keep the namespace after `call` returns, so a pool made here may be reused)."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                fd = os.open(self.ns_path, os.O_RDONLY)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns into {self.name}: {os.strerror(err)}")
                finally:
                    os.close(fd)
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"netns-{self.name}", daemon=True)
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def wait_port(self, address: str, port: int, timeout: float = 30.0) -> None:
        """Until something accepts TCP connections on address:port in this namespace."""

        def probe() -> None:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with socket.create_connection((address, port), timeout=1):
                        return
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{self.name}: nothing listens on {address}:{port}") from None
                    time.sleep(0.1)

        self.call(probe)

    def processes(self) -> list[int]:
        """Every process in this namespace but the holder and its `sleep` (shims, containers, daemons)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in (self.holder.pid, os.getpid()):
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == self.ns_id and not _is_child(int(entry), self.holder.pid):
                    found.append(int(entry))
            except OSError:
                continue
        return found

    def kill_all(self) -> None:
        """SIGKILL what is left in the namespace (all of it started by this test), then the holder."""
        for pid in self.processes():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.holder.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.kill()
        self.holder.wait(timeout=10)


def _is_child(pid: int, parent: int) -> bool:
    """Whether `parent` is `pid`'s parent (the holder's unshare is the sleep's)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False


class DockerHost(Namespace):
    """A namespace with its own `dockerd` (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        insecure_registries: tuple[str, ...] = (),
        extra_args: tuple[str, ...] = (),
        start: bool = True,
    ):
        super().__init__(name)
        self.address: str | None = None  # 10.77.0.N once a switch connects it
        self.root = Path(tempfile.mkdtemp(prefix="fgd-", dir="/tmp"))  # short: containerd's socket paths
        self.socket = self.root / "docker.sock"
        self.base_url = f"unix://{self.socket}"
        self.log_path = self.root / "dockerd.log"
        self.insecure_registries = insecure_registries
        self.extra_args = extra_args
        self.dockerd: subprocess.Popen | None = None
        self._client: docker.DockerClient | None = None
        self.keep: set[int] = set()  # processes of this namespace that outlive its dockerd (a registry)
        if start:
            try:
                self.start()
            except BaseException:
                self.stop()
                raise

    def start(self, timeout: float = 60.0) -> None:
        (self.root / "daemon.json").write_text("{}")  # never the machine's /etc/docker/daemon.json
        argv = [
            "dockerd", f"--config-file={self.root}/daemon.json",
            "--bridge=none", "--iptables=false", "--ip6tables=false",
            f"--data-root={self.root}/data", f"--exec-root={self.root}/x", f"--host={self.base_url}",
            f"--pidfile={self.root}/docker.pid", "--shutdown-timeout=2", "--log-level=warn",
            *(f"--insecure-registry={r}" for r in self.insecure_registries), *self.extra_args,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.dockerd = self.popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.dockerd.poll() is not None:
                raise RuntimeError(f"{self.name}: dockerd exited {self.dockerd.returncode}: {self.log_tail()}")
            try:
                client = docker.DockerClient(base_url=self.base_url, timeout=900)
                client.ping()
                self._client = client
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: dockerd did not answer: {self.log_tail()}") from None
                time.sleep(0.2)

    @property
    def client(self) -> docker.DockerClient:
        """The docker SDK client on this host's socket (API version negotiated)."""
        if self._client is None:
            raise RuntimeError(f"{self.name}: dockerd is not running")
        return self._client

    def env(self) -> dict[str, str]:
        """Environment for a `docker` CLI (or a program using docker.from_env) aimed at this host."""
        return {**os.environ, "DOCKER_HOST": self.base_url, "DOCKER_API_VERSION": "1.41"}

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def load_image(self, tar: Path) -> float:
        """`docker load < tar` into this host; the seconds it took."""
        start = time.monotonic()
        with open(tar, "rb") as f:
            self.client.images.load(f)
        return time.monotonic() - start

    def stop_dockerd(self, timeout: float = 30.0) -> None:
        """Stop dockerd alone (a lost host: its containers go with it), leaving the namespace."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self.dockerd is not None and self.dockerd.poll() is None:
            self.dockerd.terminate()
            try:
                self.dockerd.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.dockerd.kill()
                self.dockerd.wait(timeout=10)
        for pid in self.processes():  # the shims and containers outlive a dockerd killed hard
            if pid in self.keep:
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop dockerd, kill what is left in the namespace and the holder, unmount and remove the folder."""
        try:
            self.stop_dockerd()
        finally:
            self.kill_all()
            _unmount_under(self.root)
            shutil.rmtree(self.root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """Lazily unmount whatever a killed dockerd left mounted below `root` (deepest first)."""
    prefix = str(root) + "/"
    points = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, stdin=subprocess.DEVNULL)


class Switch(Namespace):
    """A namespace with a Linux bridge; hosts connect to it by veth on 10.77.0.0/24."""

    def __init__(self, name: str = "switch"):
        super().__init__(name)
        self.sh("ip link add br0 type bridge && ip link set br0 up")
        self.ports: dict[str, str] = {}  # host name -> the switch-side veth
        self._next = 1

    def connect(self, host: Namespace, number: int | None = None) -> str:
        """Give `host` an eth0 with 10.77.0.N/24 (N = `number` or the next free), wired to the
        bridge; the address. The veth pair is made inside the switch's namespace, one end moved
        into the host's by process id, so the names are private to these namespaces."""
        number = number if number is not None else self._next
        self._next = max(self._next, number) + 1
        port = f"p{number}-{os.getpid() % 100000}"[:15]
        address = f"{SUBNET}.{number}"
        self.run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", str(host.pid)])
        self.sh(f"ip link set {port} master br0 && ip link set {port} up")
        host.sh(f"ip addr add {address}/24 dev eth0 && ip link set eth0 up")
        self.ports[host.name] = port
        if isinstance(host, DockerHost):
            host.address = address
        return address

    def cut(self, host: Namespace) -> None:
        """Take `host`'s link down at the switch: it is cut off from the others (its daemons run on)."""
        self.run(["ip", "link", "set", self.ports[host.name], "down"])

    def restore(self, host: Namespace) -> None:
        self.run(["ip", "link", "set", self.ports[host.name], "up"])

    def stop(self) -> None:
        self.kill_all()


@dataclass
class Swarm:
    """A manager and workers in one Swarm over a `Switch`, with a registry on the manager."""

    switch: Switch
    manager: DockerHost
    workers: list[DockerHost]
    registry: subprocess.Popen | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def hosts(self) -> list[DockerHost]:
        return [self.manager, *self.workers]

    def node_id(self, host: DockerHost) -> str:
        return host.client.info()["Swarm"]["NodeID"]

    def node(self, host: DockerHost) -> Any:
        """The manager's view of `host`'s node (docker.models.nodes.Node)."""
        return self.manager.client.nodes.get(self.node_id(host))

    def label(self, host: DockerHost, **labels: str) -> None:
        node = self.node(host)
        spec = dict(node.attrs["Spec"])
        spec["Labels"] = {**spec.get("Labels", {}), **labels}
        node.update(spec)

    def tasks_by_host(self, service: Any, state: str = "running") -> dict[str, int]:
        """How many of `service`'s tasks are in `state` on each host (by host name)."""
        names = {self.node_id(h): h.name for h in self.hosts}
        counts: dict[str, int] = {}
        for task in service.tasks():
            if task["Status"]["State"] == state and task.get("DesiredState") == "running":
                host = names.get(task.get("NodeID", ""), "?")
                counts[host] = counts.get(host, 0) + 1
        return counts

    def push(self, image: str, name: str | None = None) -> str:
        """Tag `image` (a name in the manager's engine) as 10.77.0.1:5000/<name> and push it; the name."""
        target = f"{REGISTRY}/{name or image}"
        repository, tag = target.rsplit(":", 1) if ":" in target.rsplit("/", 1)[1] else (target, "latest")
        self.manager.client.images.get(image).tag(repository, tag)
        for chunk in self.manager.client.images.push(repository, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise RuntimeError(f"push {repository}:{tag}: {chunk['error']}")
        return f"{repository}:{tag}"

    def pull(self, hosts: list[DockerHost], name: str, local: str | None = None) -> list[float]:
        """Pull `name` (10.77.0.1:5000/...) on `hosts` at once, tagging it `local` there too; the
        seconds each took."""

        def one(host: DockerHost) -> float:
            start = time.monotonic()
            repository, tag = name.rsplit(":", 1)
            image = host.client.images.pull(repository, tag=tag)
            if local:
                image.tag(*local.rsplit(":", 1))
            return round(time.monotonic() - start, 1)

        return _parallel([lambda h=h: one(h) for h in hosts])

    def stop(self) -> None:
        def one(host: DockerHost) -> None:
            with contextlib.suppress(Exception):
                host.stop()

        _parallel([lambda h=h: one(h) for h in self.hosts])
        if self.registry is not None and self.registry.poll() is None:
            self.registry.kill()
            self.registry.wait(timeout=10)
        self.switch.stop()


def start_registry(
    host: DockerHost, address: str, port: int = REGISTRY_PORT, seed: Path | None = None
) -> subprocess.Popen:
    """Debian's `docker-registry` (distribution 2.x) on address:port in `host`, storage under its
    folder: a copy of `seed` (a registry storage folder kept from an earlier run) when given."""
    folder = host.root / "registry"
    folder.mkdir(parents=True, exist_ok=True)
    if seed is not None and seed.is_dir():
        shutil.copytree(seed, folder / "storage")  # a copy: the registry rewrites tag links in place
    (folder / "storage").mkdir(exist_ok=True)
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'storage'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: {address}:{port}\n"
    )
    with open(folder / "registry.log", "ab") as log:
        proc = host.popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    host.keep.add(proc.pid)
    host.wait_port(address, port)
    return proc


def make_swarm(
    workers: int = 2,
    *,
    image_tar: Path | None = None,
    worker_labels: dict[str, str] | None = None,
    heartbeat_s: float = 1.0,
    registry_seed: Path | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> Swarm:
    """A switch, a manager (10.77.0.1, registry on :5000) and `workers` workers (10.77.0.2...),
    every dockerd trusting the registry; `image_tar` loaded into every host; workers labelled
    `worker_labels` (default gpu=true). A short dispatcher heartbeat, so a lost node is noticed in
    seconds rather than the default 5 s x 3."""
    timings: dict[str, float] = {}
    start = time.monotonic()
    switch = Switch()
    hosts: list[DockerHost] = []
    swarm = Swarm(switch=switch, manager=None, workers=[], timings=timings)  # type: ignore[arg-type]
    try:
        for i in range(workers + 1):
            host = DockerHost("manager" if i == 0 else f"worker{i}", insecure_registries=(REGISTRY,))
            hosts.append(host)
            switch.connect(host, i + 1)
        swarm.manager, swarm.workers = hosts[0], hosts[1:]
        timings["dockerd_s"] = round(time.monotonic() - start, 1)
        if image_tar is not None:
            loads = _parallel([lambda h=h: h.load_image(image_tar) for h in hosts])
            timings["load_s"] = round(max(loads), 1)
            log(f"[swarm] loaded {image_tar.name} on {len(hosts)} hosts: {[round(x, 1) for x in loads]} s")
        manager = swarm.manager
        manager.client.swarm.init(
            advertise_addr=manager.address, listen_addr=f"{manager.address}:2377",
            dispatcher_heartbeat_period=int(heartbeat_s * 1e9),
        )  # fmt: skip
        token = manager.client.swarm.attrs["JoinTokens"]["Worker"]
        for worker in swarm.workers:
            worker.client.swarm.join(
                remote_addrs=[f"{manager.address}:2377"], join_token=token,
                advertise_addr=worker.address, listen_addr=f"{worker.address}:2377",
            )  # fmt: skip
        for worker in swarm.workers:
            swarm.label(worker, **(worker_labels or {"gpu": "true"}))
        swarm.registry = start_registry(manager, manager.address or f"{SUBNET}.1", seed=registry_seed)
        timings["setup_s"] = round(time.monotonic() - start, 1)
        return swarm
    except BaseException:
        swarm.workers = hosts[1:]
        swarm.manager = hosts[0] if hosts else None  # type: ignore[assignment]
        for host in hosts:
            with contextlib.suppress(Exception):
                host.stop()
        switch.stop()
        raise


def _parallel(jobs: list[Callable[[], T]]) -> list[T]:
    """Run the jobs in threads; their results in order (the first error is raised)."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int, job: Callable[[], T]) -> None:
        try:
            results[i] = job()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@contextlib.contextmanager
def docker_host(name: str = "host", **kwargs: Any) -> Iterator[DockerHost]:
    """One DockerHost for the length of a `with` block."""
    host = DockerHost(name, **kwargs)
    try:
        yield host
    finally:
        host.stop()


def provision_base(swarm: Swarm, log: Callable[[str], None] = lambda _: None) -> str:
    """Put faas-gpu/base:latest (this checkout) on every host of `swarm` through its registry, the
    way images reach nodes in production; `10.77.0.1:5000/faas-gpu/base:latest`.

    Pushing means gzipping ~1.3 GB, so the registry's storage holding python-deps is kept in
    ~/.cache/faas-gpu/registry-<deps hash> after the first run, and `make_swarm(registry_seed=...)`
    starts from a copy of it: every host pulls python-deps (and so knows its layers' digests), the
    manager builds the base on it and pushes only the checkout's layer, the workers pull that layer.
    A function image built FROM the base then pushes and pulls only its own layers."""
    from faas_gpu import base_image

    deps = base_image.deps_ref()
    remote_deps = f"{REGISTRY}/{deps}"
    seed = registry_seed()
    timings = swarm.timings
    start = time.monotonic()
    if (seed / ".complete").is_file():
        base_image.used(seed.name)  # read without the lock: its use keeps it from being pruned
        loads = swarm.pull(swarm.hosts, remote_deps, local=deps)
        log(f"[swarm] pulled {deps} from the seeded registry: {loads} s")
    else:
        base_image.ensure_deps(swarm.manager.client, base_image.Steps(log))
        swarm.push(deps)
        timings["deps_push_s"] = round(time.monotonic() - start, 1)
        _keep_seed(swarm.manager.root / "registry" / "storage", seed, deps)
        swarm.pull(swarm.workers, remote_deps, local=deps)
    timings["deps_s"] = round(time.monotonic() - start, 1)
    start = time.monotonic()
    base_image.build(swarm.manager.client, log=log)
    name = swarm.push(base_image.BASE_IMAGE)
    swarm.pull(swarm.workers, name, local=base_image.BASE_IMAGE)
    timings["base_s"] = round(time.monotonic() - start, 1)
    return name


def _keep_seed(storage: Path, seed: Path, deps: str) -> None:
    """Copy a registry's storage (python-deps pushed into it) to the cache as the seed."""
    from faas_gpu import base_image

    with base_image.locked(seed.name):
        if not (seed / ".complete").is_file():
            shutil.rmtree(seed, ignore_errors=True)
            part = seed.with_name(f"{seed.name}.part{os.getpid()}")
            shutil.copytree(storage, part)
            (part / ".complete").write_text(deps + "\n")
            os.replace(part, seed)


def seed_registry(host: DockerHost, log: Callable[[str], None] = lambda _: None) -> None:
    """Make the registry seed `provision_base` starts from, with one host: a registry on the host's
    127.0.0.1 (a registry's storage does not depend on its address), python-deps pushed into it.
    For `make base-image`, so that CI's first swarm test does not push 1.3 GB."""
    from faas_gpu import base_image

    seed = registry_seed()
    if (seed / ".complete").is_file() or shutil.which("docker-registry") is None:
        return
    deps = base_image.deps_ref()
    start = time.monotonic()
    registry = start_registry(host, "127.0.0.1", REGISTRY_PORT)
    try:
        repository, tag = f"127.0.0.1:{REGISTRY_PORT}/{deps}".rsplit(":", 1)
        host.client.images.get(deps).tag(repository, tag)
        for chunk in host.client.images.push(repository, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise RuntimeError(f"push {repository}:{tag}: {chunk['error']}")
    finally:
        registry.kill()
        registry.wait(timeout=10)
    _keep_seed(host.root / "registry" / "storage", seed, deps)
    log(f"[base-image] registry seed {seed}: {time.monotonic() - start:.1f} s")


def registry_seed() -> Path:
    """Where a registry storage holding this checkout's python-deps image is kept between runs."""
    from faas_gpu import base_image

    return base_image.cache_dir() / f"registry-{base_image.deps_ref().rsplit(':', 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.docker_hosts base-image`: build faas-gpu/base in a throwaway test host, so
    python-deps (and the registry seed) land in ~/.cache/faas-gpu before the tests need them
    (`make base-image` on a machine with no engine running, as CI)."""
    import sys

    from faas_gpu import base_image

    args = sys.argv[1:] if argv is None else argv
    if args != ["base-image"]:
        print("usage: python -m tests.docker_hosts base-image", file=sys.stderr)
        return 2
    missing = missing_tools()
    if missing:
        print(f"cannot start a test dockerd: missing {', '.join(missing)}", file=sys.stderr)
        return 1
    with docker_host("base-image") as host:
        result = base_image.build(host.client)
        seed_registry(host, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(" ".join(f"{k}={v}s" for k, v in result.timings.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
