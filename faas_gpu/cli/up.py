"""`faas-gpu up` / `down`: run the stack on embedded defaults, then build and deploy stack.yml.

Like `faasd install` + `faas-cli up`: the daemons run in the background (pid and log files in
the state folder) so that the command returns once the functions serve. Three daemons, started
in this order and stopped in the reverse one: the GPU Manager (cpu back end here), the
scheduler(s), and the stack (gateway + provider), whose replicas reach every scheduler. A
supervisor (`faas_gpu.supervise`) starts them and restarts any that dies; `down` stops it first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from faas_gpu import paths, running
from faas_gpu.build import build as build_image
from faas_gpu.build import docker_build
from faas_gpu.contract import env as env_vars
from faas_gpu.credentials import ETCD_CREDENTIALS_FILE, REDIS_CREDENTIALS_FILE, resolve_login, write_login
from faas_gpu.imagestore import BuildError, ImageStore
from faas_gpu.stack import FunctionSpec, Stack, StackError, find_stack_file, load_stack
from faas_gpu.supervise import Daemon, start_stack, supervisor_pid

from .build import BuildProgress, build_args_of
from .common import Client, CliError, credentials, json_of
from .deploy import deploy_specs
from .down import main as down_main
from .progress import Progress, replicas_stage


def daemons(args: argparse.Namespace) -> list[Daemon]:
    host = "127.0.0.1" if args.bind in ("0.0.0.0", "::") else args.bind
    store = ["--etcd", args.etcd] if args.etcd else []
    out = []
    stack_args = [
        "--bind",
        args.bind,
        "--gateway-port",
        str(args.gateway_port),
        "--provider-port",
        str(args.provider_port),
        *store,
    ]
    if args.metrics_port is not None:
        stack_args += ["--metrics-port", str(args.metrics_port)]
    if args.no_metrics:
        stack_args.append("--no-metrics")
    if args.pin_cpus:
        stack_args += ["--pin-cpus", args.pin_cpus]
    if args.redis:
        stack_args += ["--redis", args.redis]
    if args.runtime:
        stack_args += ["--runtime", args.runtime]
    if args.docker_host:
        stack_args += ["--docker-host", args.docker_host]
    for namespace in args.namespace or ():
        stack_args += ["--namespace", namespace]
    for allowed in args.callback_allow or ():
        stack_args += ["--callback-allow", allowed]
    if args.callback_timeout:
        stack_args += ["--callback-timeout", args.callback_timeout]
    if not args.no_gpu:
        out.append(
            Daemon(
                "gpu-manager",
                "gpu_manager",
                (
                    "--port",
                    str(args.gpu_manager_port),
                    "--backend",
                    args.backend,
                    "--units",
                    str(args.gpu_units),
                    "--unit-memory-mb",
                    str(args.unit_memory_mb),
                    *store,
                ),
                f"http://{host}:{args.gpu_manager_port}/healthz",
            )
        )
        urls = []
        for i in range(args.schedulers):  # replicas: one leads, the others take over when it dies
            port = args.scheduler_port + i
            name = "scheduler" if i == 0 else f"scheduler-{i + 1}"
            placement = ("--policy", args.policy, "--o3-limit", str(args.o3_limit))
            out.append(
                Daemon(name, "scheduler", ("--port", str(port), *placement, *store), f"http://{host}:{port}/healthz")
            )
            urls.append(f"http://{host}:{port}")
        stack_args += ["--scheduler", ",".join(urls)]  # every replica: the GPU client fails over
    out.append(Daemon("faas-gpu", "provider.server", tuple(stack_args), f"http://{host}:{args.gateway_port}/healthz"))
    return out


def keep_logins(args: argparse.Namespace, secrets: Path) -> None:
    """etcd's and Redis's logins into the state folder's secrets/ (0600), where every daemon finds
    them, and the URLs the daemons get without them: no password on a command line (`ps` shows
    those to every user and every replica), in stack.json or in a log."""
    for server, file_name in (("etcd", ETCD_CREDENTIALS_FILE), ("redis", REDIS_CREDENTIALS_FILE)):
        url, given = getattr(args, server), getattr(args, f"{server}_credentials")
        if not url:
            if given is not None:
                raise ValueError(f"--{server}-credentials: needs --{server} (the embedded store has no login)")
            continue
        plain, login = resolve_login(url, given, None, file_name)
        if login is not None:
            write_login(secrets / file_name, login)
        setattr(args, server, plain)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="faas-gpu up", description=__doc__)
    p.add_argument("-f", "--yaml", help="stack file to build and deploy (default stack.yaml/stack.yml)")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--gateway-port", type=int, default=8080)
    p.add_argument("--provider-port", type=int, default=8081)
    p.add_argument(
        "--metrics-port",
        type=int,
        help="the gateway's /metrics and /healthz apart, as OpenFaaS's :8082 (default $FAAS_GPU_METRICS_PORT, "
        "else 8082; 0: off)",
    )
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="the gateway keeps no per-call records (OpenFaaS's gateway always counts: this is for measuring "
        "their cost and for operators who scrape nothing; default $FAAS_GPU_METRICS, else on)",
    )
    p.add_argument(
        "--pin-cpus",
        metavar="LIST",
        help="keep the gateway and each local replica on CPUs of this list (0-3,6), the fewest-held first "
        "(default $FAAS_GPU_PIN_CPUS, else not pinned)",
    )
    p.add_argument("--gpu-manager-port", type=int, default=8090)
    p.add_argument("--scheduler-port", type=int, default=8091)
    p.add_argument(
        "--schedulers",
        type=int,
        default=1,
        help="scheduler replicas, on --scheduler-port and the ports after it (default 1)",
    )
    p.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="GPU Manager back end (auto: the GPUs NVML finds, else emulated units on the CPU)",
    )
    p.add_argument(
        "--policy",
        type=_contract(env_vars.placement_name),
        default=None,
        help=f"the scheduler's placement: {', '.join(env_vars.PLACEMENT_POLICIES)} (GPU-FaaS §IV; default "
        f"${env_vars.PLACEMENT.name}, else {env_vars.PLACEMENT.default})",
    )
    p.add_argument(
        "--o3-limit",
        type=_contract(env_vars.skip_limit),
        default=None,
        help=f"lalb_o3's skip limit, >= 0 (default ${env_vars.O3_LIMIT.name}, else {env_vars.O3_LIMIT.default})",
    )
    p.add_argument("--gpu-units", type=int, default=2, help="emulated units of the cpu back end")
    p.add_argument("--unit-memory-mb", type=float, default=1024)
    p.add_argument("--no-gpu", action="store_true", help="no GPU Manager or scheduler: models run in the instances")
    p.add_argument(
        "--etcd",
        help="etcd URL (default: embedded datastore); a user:password@ in it is moved to secrets/etcd-credentials",
    )
    p.add_argument(
        "--redis",
        help="Redis URL for async invocations (default: embedded queue); a user:password@ in it is moved to "
        "secrets/redis-credentials",
    )
    p.add_argument(
        "--etcd-credentials",
        type=Path,
        help="file with etcd's login for the daemons (user:password), copied to secrets/etcd-credentials (0600)",
    )
    p.add_argument(
        "--redis-credentials",
        type=Path,
        help="file with Redis's login for the daemons (user:password), copied to secrets/redis-credentials (0600)",
    )
    p.add_argument(
        "--runtime",
        choices=env_vars.RUNTIMES,
        help="what runs the functions: local processes, or docker containers of their images (built with "
        "docker build of the template, as faas-cli build does), or swarm services (the images also pushed to "
        "the registry their names say; --bind a node address so replicas on other nodes reach the scheduler); "
        "default $FAAS_GPU_RUNTIME, else local",
    )
    p.add_argument(
        "--docker-host",
        help="the docker runtime's engine, or the swarm runtime's manager (default $FAAS_GPU_DOCKER_HOST, DOCKER_HOST)",
    )
    p.add_argument(
        "--build-arg", action="append", help="KEY=VALUE for the docker builds (e.g. BASE_IMAGE=faas-gpu/base:latest)"
    )
    p.add_argument(
        "--namespace",
        action="append",
        help="a namespace functions may be deployed to (repeatable; the list replaces the default openfaas-fn, "
        "as the provider's --namespace: the certifier's CERTIFIER_NAMESPACES runs need openfaas-fn and theirs)",
    )
    p.add_argument(
        "--callback-allow",
        action="append",
        metavar="HOSTS",
        help="host names, IPs or CIDRs (repeatable, or a comma list) async callbacks may reach although loopback, "
        "private or the stack's own, e.g. 127.0.0.1 for a receiver on this host (default "
        "$FAAS_GPU_CALLBACK_ALLOW, else none; README: Limits and security)",
    )
    p.add_argument(
        "--callback-timeout",
        metavar="DURATION",
        help="one callback delivery's whole time (default $FAAS_GPU_CALLBACK_TIMEOUT, else 10s)",
    )
    p.add_argument("--no-deploy", action="store_true", help="only start the stack")
    p.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the stack")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress lines on a terminal for builds and replicas starting (never shown in a pipe)",
    )
    return p


def _contract(parse):
    """An argparse type from a contract parser: its ValueError is the flag's error."""

    def typed(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = parse.__name__
    return typed


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.schedulers < 1:
        parser.error("--schedulers: must be at least 1")
    try:  # written out for the schedulers, so a restart by the supervisor keeps them
        args.policy = args.policy or env_vars.PLACEMENT.read()
        args.o3_limit = env_vars.O3_LIMIT.read() if args.o3_limit is None else args.o3_limit
    except ValueError as exc:
        parser.error(f"${env_vars.PLACEMENT.name} / ${env_vars.O3_LIMIT.name}: {exc}")
    home = paths.home()
    try:
        keep_logins(args, paths.secrets_dir(home))
    except ValueError as exc:
        parser.error(str(exc))
    started = start_stack(home, daemons(args))
    host = "127.0.0.1" if args.bind in ("0.0.0.0", "::") else args.bind
    gateway_url = f"http://{host}:{args.gateway_port}"
    record = running.record_stack(home, gateway_url, f"http://{host}:{args.provider_port}")
    deployed: list[str] = []
    incomplete: UpIncomplete | None = None
    if not args.no_deploy:
        runtime = args.runtime or env_vars.RUNTIME.read()
        docker = None
        if runtime in ("docker", "swarm"):  # swarm: pushed too, so every node can pull it
            docker = DockerBuild(args.docker_host, build_args_of(args.build_arg or []), push=runtime == "swarm")
        try:
            deployed = up_deploy(args.yaml, gateway_url, docker=docker, progress=not args.no_progress)
        except UpIncomplete as exc:  # the stack serves what deployed; say so, then fail with the rest
            deployed, incomplete = exc.deployed, exc
    secrets = paths.secrets_dir()
    print(f"faas-gpu is serving (pids {', '.join(f'{n} {p}' for n, p in started.items())}; logs in {home})")
    print(f"  gateway:      {gateway_url}")
    print(f"  provider API: http://{host}:{args.provider_port}")
    metrics_port = args.metrics_port if args.metrics_port is not None else env_vars.METRICS_PORT.read()
    if metrics_port:
        print(f"  metrics:      http://{host}:{metrics_port}/metrics")
    if not args.no_gpu:
        scheduler_urls = ", ".join(f"http://{host}:{args.scheduler_port + i}" for i in range(args.schedulers))
        print(
            f"  GPU path:     scheduler {scheduler_urls} (placement {args.policy}"
            f"{f', skip limit {args.o3_limit}' if args.policy == 'lalb_o3' else ''}), "
            f"GPU Manager ({args.backend}) http://{host}:{args.gpu_manager_port}"
        )
    print(f"  credentials:  {secrets / 'basic-auth-user'} and {secrets / 'basic-auth-password'}")
    print(f"  recorded in:  {record} (faas-gpu finds this stack from any folder)")
    isolation = functions_isolation(gateway_url)
    if isolation is not None:
        print(f"  functions:    {isolation}")
    for name in deployed:
        print(f"  function:     {gateway_url}/function/{name}")
    if deployed and not args.no_gpu:
        # Not pre-loaded: the client exports the model from the shape of the first real input, and
        # no made-up input is right for every handler (Triton asks each model for its warm-up
        # sample for the same reason). A user told so does not take 15 s for a hang.
        print(
            "  first call:   a function's first call on the GPU path loads its model (export, upload, load on a "
            "unit: seconds, X-Faas-Gpu-Cache: miss); later calls reuse it (hit)"
        )
    print("Try: echo hello | .venv/bin/faas-gpu invoke echo    Stop: .venv/bin/faas-gpu down")
    if incomplete is not None:
        print(f"faas-gpu: up: the stack serves, but not every function: {incomplete}", file=sys.stderr, flush=True)
    if args.foreground:
        try:
            while supervisor_pid(home) is not None:
                time.sleep(1)
        except KeyboardInterrupt:
            down_main([])
    return 1 if incomplete is not None else 0


def functions_isolation(gateway: str) -> str | None:
    """What the stack says of its functions' isolation (/system/info's `faasGpuIsolation`, the
    local runtime's sandbox), in words; None where it says nothing (containers: the engine's)."""
    client = Client(gateway, credentials(argparse.Namespace(), gateway, paths.home()))
    try:
        resp = client.request("GET", "/system/info")
        said = (resp.json().get("provider") or {}).get("faasGpuIsolation") if resp.status_code == 200 else None
    except (CliError, ValueError, AttributeError):
        return None
    if not isinstance(said, dict) or not said.get("message"):
        return None
    return str(said["message"]) if said.get("isolated") else f"WARNING: {said['message']}"


# -- what `up` runs once the daemons serve ------------------------------------------------
def wait_ready(client: Client, name: str, namespace: str | None, timeout_s: float, *, progress: bool = True) -> bool:
    """Until a replica of `name` serves, or its keep-alive has taken it to zero (`replicas` 0: its
    next request starts one, nothing to wait for); on a terminal, a line says how many are ready
    (`progress`). A scale-zero function whose keep-alive clock runs compressed (`faas-gpu replay`)
    can be at zero before its first replica passes its readiness check."""
    deadline = time.monotonic() + timeout_s
    params = {"namespace": namespace} if namespace else {}
    with Progress(name, enabled=progress) as line:
        while time.monotonic() < deadline:
            resp = client.request("GET", f"/system/function/{name}", params=params)
            if resp.status_code == 200:
                body = json_of(resp, "ready")
                available = int(body.get("availableReplicas") or 0)
                line.show(replicas_stage(available, int(body.get("replicas") or 1)))
                if available > 0 or body.get("replicas") == 0:
                    return True
            time.sleep(0.2)
    return False


@dataclass(frozen=True)
class DockerBuild:
    """How `up` builds images for the docker runtime: on which engine, with which build args."""

    docker_host: str | None = None
    build_args: dict[str, str] = field(default_factory=dict)
    push: bool = False
    """Push each image to the registry its name says (the swarm runtime: workers pull from it)."""


def up_deploy(
    yaml_path: str | None,
    gateway: str,
    ready_timeout_s: float = 180,
    docker: DockerBuild | None = None,
    progress: bool = True,
) -> list[str]:
    """Build and deploy every function of the stack file, then wait until each serves (for `up`);
    `docker`: build each image with the engine (the docker runtime runs images), not into the store;
    `progress`: lines on a terminal for each build and wait (never in a pipe)."""
    path = find_stack_file(yaml_path)
    if path is None:
        return []
    stack = load_stack(path)
    client = Client(gateway, credentials(argparse.Namespace(), gateway, paths.home()))
    failed: list[str] = []
    built = [spec for spec in stack.functions.values() if _build(spec, stack, docker, progress, failed)]
    names: list[str] = []
    try:
        names = deploy_specs(client, built)
    except CliError as exc:  # each failure was printed; the functions that did deploy are waited for
        failed.append(str(exc))
    for spec in built:
        if spec.name in names and not wait_ready(client, spec.name, spec.namespace, ready_timeout_s, progress=progress):
            failed.append(
                f"{spec.name} did not become ready within {ready_timeout_s:.0f}s; see `faas-gpu describe "
                f"{spec.name}` and `faas-gpu logs {spec.name}`"
            )
    _profile_missing(path, stack)  # in the background: the functions serve on a conservative plan meanwhile
    if failed:
        raise UpIncomplete(names, failed)
    return names


class UpIncomplete(CliError):
    """`up` deployed what it could (`deployed`) but not everything (`failures`, one line each)."""

    def __init__(self, deployed: list[str], failures: list[str]):
        self.deployed, self.failures = deployed, failures
        super().__init__("; ".join(failures))


def _build(spec: FunctionSpec, stack: Stack, docker: DockerBuild | None, progress: bool, failed: list[str]) -> bool:
    """Build one function for `up` (not when its inputs are what the image store's image was built
    from: `build(reuse=True)`); a failure is printed and noted in `failed`, and the other
    functions still build and deploy. False: do not deploy it."""
    if spec.skip_build:
        return True
    print(f"Building {spec.name} ({spec.image})", flush=True)
    try:
        if docker is not None:
            docker_build(
                spec,
                stack_dir=stack.stack_dir,
                build_args=docker.build_args,
                docker_host=docker.docker_host,
                push=docker.push,
            )
            return True
        store = ImageStore()
        before = store.get(spec.image)
        with BuildProgress(spec.name, enabled=progress) as step:
            record = build_image(spec, store, stack_dir=stack.stack_dir, on_step=step, reuse=True)
        if before is not None and before.folder == record.folder:
            print(f"  {spec.image} is up to date: {spec.name}'s handler, template and requirements are unchanged")
        return True
    except (BuildError, StackError) as exc:
        print(f"faas-gpu: up: {spec.name} not deployed: its build failed: {exc}", file=sys.stderr, flush=True)
        failed.append(f"{spec.name}'s build failed")
        return False


def _profile_missing(path: Path, stack) -> None:
    """Profile, in the background, the models the autoscaler will predict that have no profile yet
    (or only one taken on a busy machine). A deploy never waits for a profile: such a function
    already serves on a conservative plan, and the autoscaler re-plans it once the profile is
    stored. The profiler runs at the lowest CPU priority (it measures this node, the figures the
    planner needs; nice keeps it behind the functions), its output in the state folder's
    `profile.log`."""
    from faas_gpu.profiling.cli import MODEL_ANNOTATION, SOURCE_ANNOTATION
    from faas_gpu.profiling.predictor import LatencyPredictor
    from faas_gpu.profiling.store import ProfileStore, profiles_db

    missing: list[tuple[str, bool]] = []
    seen: set[str] = set()  # a model several functions name is profiled once, by the first of them
    with ProfileStore(profiles_db()) as store:
        predictor = LatencyPredictor(store)
        for spec in stack.functions.values():
            if SOURCE_ANNOTATION not in (spec.annotations or {}):
                continue
            model = (spec.annotations or {}).get(MODEL_ANNOTATION) or spec.name
            if model in seen:
                continue
            seen.add(model)
            if not predictor.has(model):
                missing.append((spec.name, False))
            elif store.noisy(model) is not None:  # measured on a busy machine last time: try again
                missing.append((spec.name, True))
    if not missing:
        return
    names = [name for name, _ in missing]
    again = any(noisy for _, noisy in missing)  # measured on a busy machine last time: measure again
    log_path = paths.home() / "profile.log"
    argv = [sys.executable, "-m", "faas_gpu.cli", "profile", "-f", str(path), *names, "--repeat", "5"]
    with open(log_path, "ab") as log:
        subprocess.Popen(
            [*argv, *(["--remeasure"] if again else [])],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives `up`, as the daemons do
            preexec_fn=lambda: os.nice(19),
            env={**os.environ, "FAAS_GPU_HOME": str(paths.home())},
        )
    print(
        f"Profiling the model of {', '.join(names)} in the background (log: {log_path}); until it is stored "
        f"{'they serve' if len(names) > 1 else 'it serves'} on a conservative plan, then the autoscaler re-plans",
        flush=True,
    )
