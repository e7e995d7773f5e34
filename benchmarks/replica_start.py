"""How long a local replica takes from its start to serving (`/_/ready` answers 200).

Issue 41 put each replica in a sandbox (`faas_gpu.sandbox`: its own uid, mount, PID and IPC
namespaces, a clean environment); issue 44 wants a replica serving within 300 ms. This measures
what a start costs on the local runtime as the provider runs it (`LocalRuntime._spawn`, then a
tight probe of the watchdog every 2 ms, without the supervisor's 100 ms tick), for:
- `classic`: an envProcess-only function (`cat`, the classic watchdog, no image);
- `echo`: the python3-gpu echo example built into a fresh image store (mode inproc: the watchdog
  imports the template and the handler, as every python3-gpu replica does).

Run it as root (the sandbox then drops to the function's uid) or as a user (user namespaces),
with `--isolation off` for the same runtime without the walls, or from a checkout before issue 41
(`PYTHONPATH=<that checkout>`) for the runtime without the launcher. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import tempfile
import time
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
    from provider.runtime.local import LocalRuntime
    from provider.runtime.processes import probe
    from provider.runtime.replicas import FunctionReplicas
    from provider.store import SecretStore
    from provider.types import FunctionDeployment, FunctionRecord

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / ".faas-gpu"
        home.mkdir(mode=0o700)
        images = ImageStore(home / "images")
        stack = load_stack(REPO_ROOT / "stack.yml")
        build(stack.functions["echo"], images, Path(tmp) / "build", stack_dir=REPO_ROOT)
        extra = {}
        if "isolation" in inspect.signature(LocalRuntime).parameters:  # a checkout before issue 41 has none
            extra["isolation"] = args.isolation
        runtime = LocalRuntime(home, images, SecretStore(home / "function-secrets"), LogStore(home / "logs"), **extra)
        kinds = {
            "classic": FunctionDeployment(service="classic", image="classic", envProcess="cat"),
            "echo": FunctionDeployment(service="echo", image="faas-gpu/echo:latest"),
        }
        out: dict[str, dict[str, float]] = {}
        try:
            for kind, dep in kinds.items():
                record = FunctionRecord(dep, "openfaas-fn", 1)
                fn = FunctionReplicas(record, runtime.plan(record))
                times = []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    replica = runtime._spawn(fn)
                    while not probe(replica):
                        if replica.proc.poll() is not None:
                            raise SystemExit(f"{kind}: the replica exited with {replica.proc.returncode}")
                        time.sleep(0.002)
                    times.append(time.perf_counter() - t0)
                    runtime._stop_all([replica], 5)
                out[kind] = {
                    "median_ms": round(statistics.median(times) * 1000, 1),
                    "min_ms": round(min(times) * 1000, 1),
                    "max_ms": round(max(times) * 1000, 1),
                }
                print(f"{kind}: median {out[kind]['median_ms']} ms over {args.rounds} starts", flush=True)
        finally:
            runtime.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
