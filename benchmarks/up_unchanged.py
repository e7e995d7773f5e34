"""How long `faas-gpu up` takes on a stack that has not changed since the last `up` (issue 46).

`up` builds only what changed (the image store keeps the content hash of each image's build
inputs) and starts nothing that runs, so its second run is the deploy (a PUT per function, of the
same spec: no replica restarts) and the wait for ready replicas. This runs the real CLI twice on
a fresh state folder and free ports: the first `up` (daemons started, functions built, deployed),
then the same `up` again with pip forbidden from any index (PIP_NO_INDEX, an index URL nothing
answers), and `down`. `up_unchanged_s` is the second run's wall time.

The stack is the repository's `stack.yml` without the functions that need a package index to
build (embed) or an image (printenv): echo and classify, classify without its model annotations
(so that no profile is taken: what deploy does without one is another part of issue 46); or
`--stack FILE`. `--no-gpu` by default
(the GPU path's daemons start in the first run either way; the second finds them running).
`measure()` is what another benchmark calls (benchmarks/cold_start.py's `up_unchanged_s`).

The last line is one JSON object: {"up_first_s", "up_unchanged_s", "functions", "rebuilt"}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.ports import free_port  # noqa: E402

OFFLINE = {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": ""}


def measure_up(stack_file: Path, home: Path, args: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one `faas-gpu up -f stack_file <args>` with state folder `home`."""
    # the stack's record (`up` writes it for the CLI) beside the state folder, not in the user's config
    full_env = {**os.environ, "FAAS_GPU_HOME": str(home), "FAAS_GPU_CONFIG": str(home.parent / "config.yml")}
    full_env.update(env or {})
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", "up", "-f", str(stack_file), "--no-progress", *args],
        cwd=stack_file.parent,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"faas-gpu up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took


def _stack(out: Path, names: list[str]) -> Path:
    """The repository's stack.yml with only `names`, their handlers copied beside it (a handler must
    be inside the stack file's folder), and of their annotations only the SLO (with a model's,
    INFless would profile the model first)."""
    data = yaml.safe_load((REPO / "stack.yml").read_text())
    functions = {}
    for name in names:
        spec = dict(data["functions"][name])
        shutil.copytree(REPO / spec["handler"], out / name, ignore=shutil.ignore_patterns("__pycache__", "weights.pt"))
        spec["handler"] = f"./{name}"
        spec["annotations"] = {k: v for k, v in (spec.get("annotations") or {}).items() if k == "com.faas-gpu.slo-ms"}
        functions[name] = spec
    path = out / "stack.yml"
    path.write_text(yaml.safe_dump({**data, "functions": functions}, sort_keys=False))
    return path


def measure(stack_file: Path | None = None, gpu: bool = False) -> dict:
    """`up` twice on a fresh state folder and free ports (the second offline), then `down`:
    {"up_first_s", "up_unchanged_s", "functions", "rebuilt"} (`stack_file`: default the
    repository's echo and classify; `gpu`: the GPU Manager and scheduler on the cpu back end)."""
    with tempfile.TemporaryDirectory(prefix="up-unchanged-") as tmp:
        root = Path(tmp)
        stack_file = stack_file.resolve() if stack_file else _stack(root, ["echo", "classify"])
        functions = sorted(yaml.safe_load(stack_file.read_text())["functions"])
        home = root / "state"
        ports = ["--gateway-port", str(free_port()), "--provider-port", str(free_port()), "--metrics-port", "0"]
        if gpu:
            ports += ["--backend", "cpu", "--gpu-manager-port", str(free_port()), "--scheduler-port", str(free_port())]
        else:
            ports.append("--no-gpu")
        try:
            first = measure_up(stack_file, home, ports)
            images = {p.name: p.resolve() for p in (home / "images").iterdir() if not p.name.startswith(".")}
            unchanged = measure_up(stack_file, home, ports, OFFLINE)
            rebuilt = sorted(n for n, p in images.items() if (home / "images" / n).resolve() != p)
        finally:
            subprocess.run(
                [sys.executable, "-m", "faas_gpu.cli", "down"],
                env={**os.environ, "FAAS_GPU_HOME": str(home), "FAAS_GPU_CONFIG": str(home.parent / "config.yml")},
                capture_output=True,
                timeout=300,
            )
    return {"up_first_s": round(first, 2), "up_unchanged_s": round(unchanged, 2), "functions": functions,
            "rebuilt": rebuilt}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", type=Path, help="a stack file (default: the repository's echo and classify)")
    p.add_argument("--gpu", action="store_true", help="start the GPU Manager and scheduler too (cpu back end)")
    opts = p.parse_args(argv)
    out = measure(opts.stack, opts.gpu)
    print(f"faas-gpu up, first run (daemons started, functions built): {out['up_first_s']:.2f} s")
    print(f"faas-gpu up, unchanged stack, pip forbidden from any index:   {out['up_unchanged_s']:.2f} s")
    print(f"images built again by the second run: {out['rebuilt'] or 'none'}")
    print(json.dumps(out))
    return 0 if not out["rebuilt"] else 1


if __name__ == "__main__":
    sys.exit(main())
