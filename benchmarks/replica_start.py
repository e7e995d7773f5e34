"""How long a local replica takes from its start to serving (`/_/ready` answers 200), and how much
memory of its own it holds, exec'd and forked.

Issue 41 put each replica in a sandbox (`faas_gpu.sandbox.replica`: its own uid, mount, PID and IPC
namespaces, a read-only tree, no capabilities, a seccomp filter, a clean environment); issue 44
wants a replica serving within 300 ms with at most 40 MB of its own. This measures what a start
costs on the local runtime as the provider runs it (`LocalRuntime._spawn`, then a tight probe of
the watchdog every 2 ms, without the supervisor's 100 ms tick), for:
- `classic`: an envProcess-only function (`cat`, the classic watchdog, no image);
- `echo`: the python3-gpu echo example built into a fresh image store (mode inproc: the watchdog
  imports the template and the handler, as every python3-gpu replica does), exec'd through the
  launcher (`FAAS_GPU_FORK_SERVER=off`);
- `echo_fork`: the same replicas forked by the fork server (`faas_gpu.sandbox.zygote`), which has
  imported torch and the template already; walls entered after the fork;
- `walls`: the launcher alone, through a replica's sandbox as the runtime builds it (the
  function's uid, its folders, the stack's code), running `/bin/true` until it exits: what the
  walls cost a start, without the watchdog's.
For each python3-gpu replica it reads its USS (`processes.uss_bytes`: Private_* of
/proc/<pid>/smaps_rollup, the replica's processes) once it has answered one call.

Run it as root (the sandbox then drops to the function's uid) or as a user (user namespaces),
with `--isolation off` for the same runtime without the walls (then nothing is forked), or from a
checkout before issue 41 (`PYTHONPATH=<that checkout>`) for the runtime without the launcher.
Last line: one JSON object; `replica_start_ms` and `replica_uss_mb` are the forked replicas'
medians, with their ratios against the exec'd ones measured in the same run.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--isolation", default="auto", help="auto, on or off (FAAS_GPU_ISOLATION)")
    args = p.parse_args()

    from faas_gpu.build import build
    from faas_gpu.imagestore import ImageStore
    from faas_gpu.paths import REPO_ROOT
    from faas_gpu.stack.schema import load_stack
    from provider.logs import LogStore
    from provider.runtime import processes
    from provider.runtime.local import LocalRuntime
    from provider.runtime.processes import probe
    from provider.runtime.replicas import FunctionReplicas
    from provider.store import SecretStore
    from provider.types import FunctionDeployment, FunctionRecord

    params = inspect.signature(LocalRuntime).parameters
    uss = getattr(processes, "uss_bytes", None)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / ".faas-gpu"
        home.mkdir(mode=0o700)
        images = ImageStore(home / "images")
        stack = load_stack(REPO_ROOT / "stack.yml")
        build(stack.functions["echo"], images, Path(tmp) / "build", stack_dir=REPO_ROOT)
        classic = FunctionDeployment(service="classic", image="classic", envProcess="cat")
        echo = FunctionDeployment(service="echo", image="faas-gpu/echo:latest")
        runs = [("classic", classic, False), ("echo", echo, False)]
        if "fork_server" in params:  # a checkout before issue 44 has none
            runs.append(("echo_fork", echo, True))
        out: dict[str, dict[str, float]] = {}
        for kind, dep, fork in runs:
            extra = {}
            if "isolation" in params:  # a checkout before issue 41 has none
                extra["isolation"] = args.isolation
            if "fork_server" in params:
                extra["fork_server"] = fork
            runtime = LocalRuntime(
                home, images, SecretStore(home / "function-secrets"), LogStore(home / "logs"), **extra
            )
            try:
                if kind == "classic" and hasattr(runtime, "walls"):  # before issue 41 no launcher to time
                    out["walls"] = _summary(walls_s(runtime, args.rounds))
                    print(f"walls: median {out['walls']['median_ms']} ms over {args.rounds} launches", flush=True)
                record = FunctionRecord(dep, "openfaas-fn", 1)
                fn = FunctionReplicas(record, runtime.plan(record))  # a python3-gpu function starts the server
                server = getattr(runtime, "fork_server", None)
                while server is not None and server.state == "starting":
                    time.sleep(0.05)
                if fork and (server is None or server.state != "ready"):
                    print(f"{kind}: no fork server ({runtime.isolation().describe()}); skipped", flush=True)
                    continue
                times, sizes = [], []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    replica = runtime._spawn(fn)
                    while not probe(replica):
                        if replica.proc.poll() is not None:
                            raise SystemExit(f"{kind}: the replica exited with {replica.proc.returncode}")
                        time.sleep(0.002)
                    times.append(time.perf_counter() - t0)
                    if kind != "classic" and uss is not None:
                        urllib.request.urlopen(urllib.request.Request(replica.url, data=b"hi"), timeout=30).read()
                        sizes.append(uss(replica.proc.pid) / 2**20)
                    runtime._stop_all([replica], 5)
                out[kind] = _summary(times)
                if sizes:
                    out[kind]["uss_mb"] = round(statistics.median(sizes), 1)
                said = f"{kind}: median {out[kind]['median_ms']} ms over {args.rounds} starts"
                print(said + (f", USS {out[kind]['uss_mb']} MB" if sizes else ""), flush=True)
            finally:
                runtime.close()
    if "echo_fork" in out:
        fork, base = out["echo_fork"], out["echo"]
        out["replica_start_ms"] = fork["median_ms"]
        out["replica_uss_mb"] = fork.get("uss_mb")
        out["start_ratio_fork_vs_exec"] = round(fork["median_ms"] / base["median_ms"], 3)
        if "uss_mb" in fork and "uss_mb" in base:
            out["uss_ratio_fork_vs_exec"] = round(fork["uss_mb"] / base["uss_mb"], 3)
    print(json.dumps(out))


def walls_s(runtime, rounds: int) -> list[float]:
    """Seconds from the launcher's start to its exit, `/bin/true` in a replica's sandbox."""
    from provider.runtime.isolation import ReplicaFolders

    try:
        from faas_gpu.sandbox.launcher import launcher_argv
    except ImportError:  # a checkout before faas_gpu/sandbox/ was a package
        from faas_gpu.sandbox import launcher_argv

    uid = runtime.walls.uid_of("openfaas-fn", "walls")
    times = []
    for i in range(rounds):
        run_dir = runtime.run_root / "openfaas-fn" / f"walls-{i}"
        folders = ReplicaFolders.make(run_dir, uid)
        box = runtime.walls.sandbox_of(["/bin/true"], {"PATH": "/usr/bin:/bin"}, None, folders, uid, None)
        t0 = time.perf_counter()
        done = subprocess.run(launcher_argv(), input=box.encode(), capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"walls: the launcher exited {done.returncode}: {done.stderr.decode()[-300:]}")
        shutil.rmtree(run_dir, ignore_errors=True)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(times) * 1000, 1),
        "min_ms": round(min(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
    }


if __name__ == "__main__":
    main()
