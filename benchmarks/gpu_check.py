"""`make gpu-check`: the GPU suite on a machine with an NVIDIA GPU (H100/H200), written to docs/GPU.md.

Without a GPU that both NVML and torch see it says so, measures nothing, leaves docs/GPU.md as it
is and exits 2 (a skip must never read as a pass). On a GPU it runs these parts, each failing
soft (its error goes in the report and the rest still run):

- discovery: NVML's view (driver, CUDA driver version, each GPU, its MIG mode and MIG devices if
  MIG is already on) and the GPU Manager's units (`gpu_manager.discovery`);
- gpu_tests: `pytest -m gpu tests/gpu` (the real-device checks), its counts;
- h2d_bandwidth: host-to-device copy bandwidth with torch, pinned and pageable (the device's
  physical limit for a load);
- classify, embed: the classify example (ResNet) and the real pretrained example (functions/embed,
  all-MiniLM-L6-v2) through scheduler -> GPU Manager (`--backend cuda`) -> worker, as
  benchmarks/gpu_path.py starts them: cache miss vs hit, the load's time and its bandwidth
  against the pinned copy's (`load_bandwidth_ratio`), the manager's accounted memory of the unit
  against NVML's own per-process figures of its workers (goal: within 10%), and the best
  closed-loop throughput whose p99 meets the SLO with the client's batching (max batch 16) and
  without (max batch 1): `batching_speedup` (goal >= 3x, Triton's dynamic batcher reaches ~3.7x);
- mps: an MPS control daemon with its own pipe and log folders (faas_gpu.mps.MPSSession)
  on the first GPU (or MIG device), a CUDA client served by it, and the daemon stopped again;
- colocation: `faas-gpu profile-colocation` on the whole GPU (the classify model beside copies of
  itself under MPS), its FBR or why it was refused.

Read-only on the device: it never changes MIG mode or geometry, clocks, compute mode or
persistence, and never resets. The MPS daemon is stopped in a `finally`, SIGTERM included.
Last line: one JSON object (the report). Exit 0: every part ran; 1: a part failed; 2: no GPU.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import closed_loop  # noqa: E402
from faas_gpu.mps import MPSError, MPSSession  # noqa: E402

SPEEDUP_GOAL = 3.0
MEMORY_TOLERANCE = 0.10
EXIT_NO_GPU = 2


@dataclass
class Context:
    """What the parts share: options, a scratch folder, and the results of the parts before."""

    scratch: Path
    seconds: float = 4.0
    slo_ms: float = 100.0
    backend: str = "cuda"  # the GPU Manager's back end ("cpu": a smoke test of the serving parts)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def figure(self, part: str, key: str) -> Any:
        """A figure of an earlier part (None if it failed or has none)."""
        return self.results.get(part, {}).get(key)


Part = Callable[[Context], dict[str, Any]]


# -- orchestration ----------------------------------------------------------------------------------
def run_parts(parts: Sequence[tuple[str, Part]], ctx: Context, log=print) -> dict[str, dict[str, Any]]:
    """Each part in turn; an exception is that part's `error` and the next one runs. An interrupt
    (Ctrl-C, SIGTERM: a time limit on a lent machine) ends the run once the part's own `finally`s
    cleaned up: that part and those not reached are recorded as such, so the report still holds
    what was measured."""
    interrupted = None
    for name, part in parts:
        if interrupted is not None:
            ctx.results[name] = {"ok": False, "error": f"not run: interrupted ({interrupted})", "seconds": 0.0}
            continue
        log(f"gpu-check: {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            out = {"ok": True, **part(ctx)}
        except _Interrupted as exc:
            interrupted = str(exc)
            out = {"ok": False, "error": f"interrupted ({exc})"}
        except Exception as exc:  # fail soft: recorded, the rest still runs
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip()[:2000]}
        out["seconds"] = round(time.perf_counter() - t0, 1)
        ctx.results[name] = out
        log(f"gpu-check: {name}: {'ok' if out['ok'] else 'FAILED: ' + out['error']}", flush=True)
    return ctx.results


def goals(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, met or not (None: not measured)."""

    def at_least(value: Any, goal: float) -> bool | None:
        return None if value is None else value >= goal

    out: dict[str, Any] = {}
    for model in ("classify", "embed"):
        r = results.get(model, {})
        out[f"{model}_batching_speedup_ge_{SPEEDUP_GOAL:g}x"] = at_least(r.get("batching_speedup"), SPEEDUP_GOAL)
        err = r.get("memory_relative_error")
        out[f"{model}_memory_within_{MEMORY_TOLERANCE:.0%}"] = None if err is None else err <= MEMORY_TOLERANCE
    out["mps_started_and_stopped"] = (
        None if "mps" not in results else bool(results["mps"].get("client_ok") and results["mps"].get("stopped"))
    )
    return out


def build_report(results: dict[str, dict[str, Any]], when: datetime.datetime) -> dict[str, Any]:
    d = results.get("discovery", {})
    return {
        "date": when.isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": d.get("device"),
        "driver": d.get("driver"),
        "cuda_driver": d.get("cuda_driver"),
        "torch": d.get("torch"),
        "torch_cuda": d.get("torch_cuda"),
        "failed_parts": [name for name, r in results.items() if not r.get("ok")],
        "goals": goals(results),
        "parts": results,
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return "`" + json.dumps(value, sort_keys=True)[:300].replace("|", "\\|") + "`"
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(report: dict[str, Any]) -> str:
    """docs/GPU.md: the device, driver, versions, date, then every part's figures or its error."""
    lines = [
        "# GPU suite results (`make gpu-check`)",
        "",
        "Written by `benchmarks/gpu_check.py`; rerun `make gpu-check` on a GPU machine to refresh it.",
        "",
        f"- date: {report['date']} (host {report['host']})",
        f"- device: {report['device'] or 'unknown (discovery failed)'}",
        f"- driver: {report['driver']}, CUDA driver {report['cuda_driver']}",
        f"- torch: {report['torch']} (CUDA {report['torch_cuda']})",
        "- failed parts: " + (", ".join(report["failed_parts"]) or "none"),
        "",
        "## Goals",
        "",
        "| goal | met |",
        "|---|---|",
    ]
    for goal, met in report["goals"].items():
        lines.append(f"| {goal} | {'not measured' if met is None else 'yes' if met else 'NO'} |")
    for name, r in report["parts"].items():
        lines += ["", f"## {name}", ""]
        if not r.get("ok"):
            lines += [f"**Failed** after {r.get('seconds')} s: `{r.get('error')}`", ""]
            continue
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in r.items() if k != "ok"]
    return "\n".join(lines) + "\n"


def gpu_missing() -> str | None:
    """Why there is no usable GPU here, or None: tests/gpu/conftest.py's check, so the suite and
    the benchmark agree."""
    from tests.gpu.conftest import gpu_missing as probe

    return probe()


class _Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the run is so that every `finally` (the MPS daemon's) runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Interrupted(f"signal {signum}")


def main(argv: list[str] | None = None, parts: Sequence[tuple[str, Part]] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "docs" / "GPU.md", help="the report (default docs/GPU.md)")
    p.add_argument("--seconds", type=float, default=4.0, help="per throughput measurement")
    p.add_argument("--slo-ms", type=float, default=100.0, help="the p99 SLO of the batching comparison")
    p.add_argument("--only", help="comma-separated parts to run (default: all)")
    args = p.parse_args(argv)

    reason = gpu_missing()
    if reason is not None:
        print(f"gpu-check: no GPU on this machine ({reason}): nothing measured, {args.out} not written.")
        print(json.dumps({"gpu": None, "skipped": reason}))
        return EXIT_NO_GPU
    chosen = list(parts if parts is not None else PARTS)
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        unknown = wanted - {name for name, _ in chosen}
        if unknown:
            p.error(f"--only: no part {', '.join(sorted(unknown))}")
        chosen = [(n, f) for n, f in chosen if n in wanted]
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            ctx = Context(Path(tmp), args.seconds, args.slo_ms)
            results = run_parts(chosen, ctx)
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = build_report(results, datetime.datetime.now(datetime.UTC))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(report))
    print(f"gpu-check: written to {args.out}")
    print(json.dumps(report, default=str))
    return 1 if report["failed_parts"] else 0


# -- the parts ----------------------------------------------------------------------------------------
def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def discovery_part(ctx: Context, nvml: Any = None) -> dict[str, Any]:
    """NVML's GPUs (read-only) and the units the GPU Manager would serve on them."""
    import torch

    from gpu_manager.discovery import discover_units

    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            gpu: dict[str, Any] = {
                "index": i,
                "name": _text(nvml.nvmlDeviceGetName(h)),
                "uuid": _text(nvml.nvmlDeviceGetUUID(h)),
                "memory_mib": round(nvml.nvmlDeviceGetMemoryInfo(h).total / 2**20),
            }
            try:
                mode = nvml.nvmlDeviceGetMigMode(h)[0]
                gpu["mig"] = "enabled" if mode == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"
            except nvml.NVMLError:
                gpu["mig"] = "not supported"
            if gpu["mig"] == "enabled":
                migs = []
                for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except nvml.NVMLError:
                        continue
                    migs.append({"uuid": _text(nvml.nvmlDeviceGetUUID(m)), "name": _text(nvml.nvmlDeviceGetName(m))})
                gpu["mig_devices"] = migs
            gpus.append(gpu)
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = nvml.nvmlSystemGetCudaDriverVersion()
    finally:
        nvml.nvmlShutdown()
    units = discover_units(nvml)
    if not gpus:
        raise RuntimeError("NVML lists no GPU")
    first = gpus[0]
    # where CUDA work can run on the first GPU: the GPU itself, or its first MIG device with MIG on
    cuda_device = first["mig_devices"][0]["uuid"] if first.get("mig_devices") else first["uuid"]
    return {
        "device": f"{first['name']} ({first['memory_mib']} MiB, MIG {first['mig']})",
        "driver": driver,
        "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpus": gpus,
        "cuda_device": cuda_device,
        "whole_gpu": first["mig"] != "enabled",
        "gpu_name": first["name"],
        "units": [{"id": u.id, "kind": u.kind, "name": u.name, "memory_mb": u.memory_mb} for u in units],
    }


def gpu_tests_part(ctx: Context) -> dict[str, Any]:
    """`pytest -m gpu tests/gpu`: the counts (its failures fail this part)."""
    junit = ctx.scratch / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-s", "-rs", "-p", "no:cacheprovider"]
    done = subprocess.run([*cmd, f"--junitxml={junit}"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed: dict[str, str] = {}
    for case in suite.iter("testcase"):
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        if bad is not None:  # the assertion's own line: what a reader of the report needs first
            failed[f"{case.get('classname')}.{case.get('name')}"] = (bad.get("message") or "")[:400]
    printed = [line for line in done.stdout.splitlines() if line and not line.startswith(("=", "_", "FAILED"))]
    if done.returncode not in (0, 5) or failed:  # 5: nothing collected
        raise RuntimeError(f"gpu tests failed: {json.dumps(failed) if failed else done.stdout[-1500:]}")
    return {**counts, "failed": list(failed), "figures": printed[-20:]}


def h2d_part(ctx: Context, mib: int = 512, repeat: int = 5) -> dict[str, Any]:
    """Host-to-device copy bandwidth, best of `repeat`: pinned (a load's limit) and pageable."""
    import torch

    dev = torch.device("cuda")
    out = {}
    for label, pinned in (("pinned", True), ("pageable", False)):
        host = torch.empty(mib * 2**20, dtype=torch.uint8, pin_memory=pinned)
        best = float("inf")
        for _ in range(repeat):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            host.to(dev, non_blocking=pinned)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[f"h2d_{label}_gb_s"] = round(mib * 2**20 / best / 1e9, 2)
    out["h2d_mib"] = mib
    return out


def slo_throughput(remote: Any, example: Any, slo_s: float, seconds: float) -> dict[str, float]:
    """The best closed-loop throughput whose p99 meets the SLO, over 1..64 callers."""
    rps, tail, callers = closed_loop.slo_throughput(lambda: remote(example), slo_s, seconds)
    return {"rps": round(rps, 2), "p99_ms": round(tail * 1000, 2), "callers": callers}


def _worker_memory_mib(manager_pgid: int, uuid: str) -> float:
    """NVML's used memory of the manager's workers (its process group) on the device `uuid`."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        total = 0
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            try:
                mine = os.getpgid(proc.pid) == manager_pgid
            except OSError:  # another container's process, or gone
                mine = False
            if mine and proc.usedGpuMemory is not None:
                total += proc.usedGpuMemory
        return total / 2**20
    finally:
        pynvml.nvmlShutdown()


def serve(ctx: Context, model: Any, example: Any) -> dict[str, Any]:
    """`model` through scheduler -> GPU Manager (--backend cuda) -> worker: miss, hit, load
    bandwidth, memory against NVML, batched vs unbatched throughput at the SLO."""
    import requests
    import torch

    from faas_gpu import client
    from faas_gpu.contract.wire import encode
    from faas_gpu.credentials import ensure_token
    from tests.daemon_process import Daemon, wait_units

    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (torch.cat([example, example]),), dynamic_shapes=({0: batch},))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    artifact = buf.getvalue()
    home = Path(tempfile.mkdtemp(prefix="serve-", dir=ctx.scratch))
    token = ensure_token(home / "secrets")
    auth = {"Authorization": f"Bearer {token}"}
    manager = Daemon("gpu_manager", home, "--backend", ctx.backend)
    scheduler = Daemon("scheduler", home)
    saved = {k: os.environ.get(k) for k in ("FAAS_GPU_SCHEDULER_URL", "FAAS_GPU_TOKEN", "FAAS_GPU_MAX_BATCH",
                                            "FAAS_GPU_BATCH_TIMEOUT_MS")}  # fmt: skip
    try:
        wait_units(scheduler.url, auth, 1, timeout_s=60)
        r = requests.put(f"{scheduler.url}/v1/models", data=artifact, headers=auth, timeout=300)
        r.raise_for_status()
        digest = r.json()["digest"]

        def job() -> tuple[float, Any]:
            t0 = time.perf_counter()
            r = requests.post(f"{scheduler.url}/v1/jobs/{digest}", data=encode(example), headers=auth, timeout=300)
            r.raise_for_status()
            return time.perf_counter() - t0, r

        miss_s, miss = job()
        hit_s = min(job()[0] for _ in range(20))
        load_s = float(miss.headers.get("X-Faas-Gpu-Load-Seconds", "nan"))
        split = {
            k: v
            for k, v in miss.headers.items()
            if k.lower().startswith("x-faas-gpu-load-") and k.lower() != "x-faas-gpu-load-seconds"
        }
        out: dict[str, Any] = {
            "artifact_mb": round(len(artifact) / 2**20, 2),
            "miss_ms": round(miss_s * 1000, 2),
            "hit_ms": round(hit_s * 1000, 2),
            "load_ms": round(load_s * 1000, 2),
            "load_split_headers": split or None,  # H3's spawn/read/to-device/warm-up split, when served
        }
        load_gb_s = len(artifact) / load_s / 1e9 if load_s > 0 else None
        h2d = ctx.figure("h2d_bandwidth", "h2d_pinned_gb_s")
        out["load_gb_s"] = None if load_gb_s is None else round(load_gb_s, 3)
        out["load_bandwidth_ratio"] = round(load_gb_s / h2d, 4) if load_gb_s and h2d else None
        # memory: what the manager counts on the unit against what NVML says its workers hold
        units = requests.get(f"{manager.url}/v1/units", headers=auth, timeout=10).json()
        unit = next(u for u in units if digest in u.get("models", []))
        accounted = float(unit["used_mb"])
        measured = _worker_memory_mib(manager.proc.pid, unit["unit"])  # the unit's id is its NVML UUID
        out.update(
            manager_used_mb=round(accounted, 1),
            nvml_workers_mib=round(measured, 1),
            memory_relative_error=round(abs(accounted - measured) / measured, 4) if measured else None,
        )
        # batching at equal SLO: the client's batching (max 16) against none (max 1)
        os.environ.update(FAAS_GPU_SCHEDULER_URL=scheduler.url, FAAS_GPU_TOKEN=token)
        tput = {}
        for label, max_batch, timeout_ms in (("nobatch", "1", "0"), ("batch", "16", "5")):
            os.environ.update(FAAS_GPU_MAX_BATCH=max_batch, FAAS_GPU_BATCH_TIMEOUT_MS=timeout_ms)
            remote = client.remote(model)
            remote(example)
            tput[label] = slo_throughput(remote, example, ctx.slo_ms / 1000, ctx.seconds)
        out.update(slo_ms=ctx.slo_ms, batch=tput["batch"], nobatch=tput["nobatch"])
        out["batching_speedup"] = (
            round(tput["batch"]["rps"] / tput["nobatch"]["rps"], 3) if tput["nobatch"]["rps"] else None
        )
        return out
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        scheduler.kill()
        manager.kill()


def classify_part(ctx: Context) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(REPO / "functions" / "classify"))
    from model import ResNetMini

    torch.manual_seed(0)
    return serve(ctx, ResNetMini(widths=(64, 128, 256)).eval(), torch.randn(1, 3, 64, 64))


def embed_part(ctx: Context) -> dict[str, Any]:
    import importlib.util

    import torch

    def module(name: str, path: Path) -> Any:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        return m

    folder = REPO / "functions" / "embed"
    embed_model = module("gpu_check_embed_model", folder / "model.py")
    tok = module("gpu_check_embed_tokenizer", folder / "tokenizer.py")
    model = embed_model.load_packaged()  # PackageMissing: this part's error
    ids = tok.WordPiece(embed_model.read_package("tokenizer.json")["tokenizer.json"]).encode("A man is eating.")
    one = torch.zeros(1, 32, dtype=torch.int64)
    one[0, : len(ids)] = torch.tensor(ids)
    return serve(ctx, model, one)


CLIENT = "import torch; x = torch.ones(1024, 1024, device='cuda'); print(float((x @ x).sum()))"


def mps_part(
    ctx: Context,
    session: Callable[[str | None], MPSSession] = MPSSession,
    client: Callable[[dict[str, str]], subprocess.CompletedProcess] | None = None,
) -> dict[str, Any]:
    """An MPS daemon with its own pipe and log folders; a CUDA client it serves; stopped again."""
    device = ctx.figure("discovery", "cuda_device")

    def run_client(env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CLIENT], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    mps = session(device)
    out: dict[str, Any] = {"device": device, "stopped": False}
    with mps:
        out["pipe_dir"] = str(mps.pipe_dir)
        done = (client or run_client)(mps.client_env())
        out["client_ok"] = done.returncode == 0
        out["client_output"] = (done.stdout + done.stderr).strip()[-300:]
        try:
            out["server_pids"] = mps.servers()
        except MPSError as exc:
            out["server_pids"] = f"unreadable: {exc}"
    out["stopped"] = not mps.running
    if not out["client_ok"]:
        raise RuntimeError(f"the CUDA client under MPS failed: {out['client_output']}")
    return out


PACKAGE_GPUS = {"A100": "A100-40GB", "H100": "H100-80GB"}  # NVML's name -> the package's MIG table


def colocation_part(ctx: Context) -> dict[str, Any]:
    """`faas-gpu profile-colocation` on the whole GPU: the classify model beside copies of itself."""
    import yaml

    if not ctx.figure("discovery", "whole_gpu"):
        return {"skipped": "MIG is on: the whole GPU runs no CUDA work (MIG mode is never changed here)"}
    uuid = ctx.figure("discovery", "cuda_device")
    name = ctx.figure("discovery", "gpu_name") or ""
    out_file = ctx.scratch / "colocation.yaml"
    cmd = [sys.executable, "-c", "import sys; from faas_gpu.cli import main; sys.exit(main())", "profile-colocation"]
    cmd += ["--model", "functions/classify/model.py:ResNetMini", "--input-shape", "3,64,64", "--batch", "32"]
    cmd += ["--name", "resnet50", "--devices", f"7g={uuid}", "--max-corunners", "2", "--repeat", "5"]
    cmd += ["--warmup", "2", "--out", str(out_file)]
    gpu = next((v for k, v in PACKAGE_GPUS.items() if k in name), None)
    if gpu:
        cmd += ["--gpu", gpu]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"profile-colocation exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    data = yaml.safe_load(out_file.read_text()) or {}
    return {
        "fbr": data.get("models", {}).get("resnet50", {}).get("fbr"),
        "refused": data.get("refused"),
        "log": done.stderr.strip().splitlines()[-6:],
    }


PARTS: list[tuple[str, Part]] = [
    ("discovery", discovery_part),
    ("gpu_tests", gpu_tests_part),
    ("h2d_bandwidth", h2d_part),
    ("classify", classify_part),
    ("embed", embed_part),
    ("mps", mps_part),
    ("colocation", colocation_part),
]


if __name__ == "__main__":
    sys.exit(main())
