"""`faas-gpu profile-colocation`: PROTEAN's RDF and FBR of a model, measured on real devices.

    faas-gpu profile-colocation --model model.py:make --input-shape 3,224,224 --batch 128 \\
        --name resnet50 --devices 7g=GPU-<uuid>,3g=MIG-<uuid>,1g=MIG-<uuid> --out measured.yaml

Each device is PROFILE=DEVICE: PROFILE a MIG profile of --gpu (7g is the whole GPU), DEVICE a GPU
or MIG UUID (`nvidia-smi -L`), `cuda`, or `cpu:THREADS` (threads standing in for a slice's compute,
where there is no GPU). The profiler uses the slices that exist; it never changes MIG mode or
geometry. It times the model's batch alone on every device (RDF = Solo(slice) / Solo(7g)), then
beside k = 1..--max-corunners copies of itself (or of --corunner) on --colocate-on, one process
each, and fits FBR from that curve under Eq. 1 (`faas_gpu.profiling.colocation`), or names why it
does not. On a GPU the FBR curve (its solo point included) runs under an MPS control daemon of the
run's own (pipe and log folders under a temporary folder, stopped at the end; --no-mps to
time-slice). A device given by NVML index is run by its UUID (CUDA counts devices in another
order). When 7g is a whole GPU with more SMs than the 7g profile (an A100: 108 against 98), its
solo time is scaled by the SM ratio to the 7g profile's, whose SM count comes from NVML's profile
info of a MIG-enabled GPU of the same model, else from the package's MIG table
(`faas_gpu/policy_data/mig_profiles.yaml`); a 7g MIG slice is the exact baseline. The numbers go
to --out as an overlay of the package's assumptions.yaml (`base: package`), merged with what the
file already holds, for the scheduler's --protean-assumptions.
Bad input is one line naming the flag, exit 2.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Any

import yaml

from .cli import UsageError, load_model, parse_shape
from .colocation import Fit, Measurement, fit_fbr, fit_rdf, median_s, merge_overlays, overlay
from .colocation_runner import Device, Run, RunnerError, Workload, co_located_times
from .mps_session import MPSError, MPSSession
from .operators import DTYPES

PROG = "faas-gpu profile-colocation"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile-colocation",
        help="measure PROTEAN's RDF and FBR of a model on GPUs/MIG slices (or CPU threads)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY")
    p.add_argument("--input-shape", required=True, metavar="C,H,W", help="one input without the batch")
    p.add_argument("--input-dtype", default="float32", choices=DTYPES)
    p.add_argument("--batch", type=int, required=True, help="the serving batch size")
    p.add_argument("--name", required=True, help="the model's name in assumptions.yaml (e.g. resnet50)")
    p.add_argument("--devices", required=True, metavar="PROFILE=DEVICE,...", help="e.g. 7g=GPU-..,3g=MIG-..")
    p.add_argument("--gpu", help="GPU model the profiles belong to (default: the package assumptions' gpu)")
    p.add_argument("--colocate-on", metavar="PROFILE", help="device of the FBR curve (default 7g, else the first)")
    p.add_argument("--max-corunners", type=int, default=3, help="K: co-runners 1..K (default 3; 0: no FBR)")
    p.add_argument("--corunner", metavar="MODULE:FACTORY", help="co-run this model instead of copies")
    p.add_argument("--corunner-input-shape", metavar="C,H,W", help="default: --input-shape")
    p.add_argument("--corunner-batch", type=int, help="default: --batch")
    p.add_argument("--corunner-fbr", type=float, help="the co-runner's FBR (required with --corunner)")
    p.add_argument("--repeat", type=int, default=10, help="timed batches per run, median kept (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches first (default 3)")
    p.add_argument(
        "--mps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the FBR curve on a GPU under an MPS daemon of its own (default; --no-mps: time-sliced)",
    )
    p.add_argument("--out", type=Path, help="overlay file to write or update (default: print it)")
    p.set_defaults(func=run)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="faas-gpu")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["profile-colocation", *(sys.argv[1:] if argv is None else argv)]))


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        fragment = _measure(args, plan)
        text = _write(args.out, fragment)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except (OSError, RunnerError, MPSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if args.out is None:
        print(text, end="")
    else:
        print(f"written to {args.out}", file=sys.stderr)
    return 0


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    """Every flag checked, and the model loaded once here, before any worker starts."""
    from faas_gpu.policy_data.protean import default_assumptions, gpu_model

    for flag, value, low in (("--batch", args.batch, 1), ("--repeat", args.repeat, 1), ("--warmup", args.warmup, 0)):
        if value < low:
            raise UsageError(f"{flag}: must be >= {low}, got {value}")
    if args.max_corunners < 0:
        raise UsageError(f"--max-corunners: must be >= 0, got {args.max_corunners}")
    package_gpu = str(default_assumptions().raw.get("gpu", "A100-40GB"))
    try:
        gpu = gpu_model(args.gpu or package_gpu)
    except (KeyError, ValueError) as exc:
        raise UsageError(f"--gpu: {exc}") from None
    devices: dict[str, Device] = {}
    for item in args.devices.split(","):
        label, sep, spec = item.strip().partition("=")
        if not sep or not label or not spec:
            raise UsageError(
                f"--devices: expected PROFILE=DEVICE,... like 7g=GPU-..,3g=MIG-.. or 7g=cpu:2, got {item!r}"
            )
        try:
            key = gpu.profile(label.strip()).key
            device = Device.parse(spec).by_uuid()
        except ValueError as exc:
            raise UsageError(f"--devices: {label}: {exc}") from None
        if key in devices:
            raise UsageError(f"--devices: {key} given twice")
        devices[key] = device
    whole = gpu.whole
    if args.colocate_on:
        try:
            on = gpu.profile(args.colocate_on).key
        except ValueError as exc:
            raise UsageError(f"--colocate-on: {exc}") from None
        if on not in devices:
            raise UsageError(f"--colocate-on: {on} is not one of --devices ({', '.join(devices)})")
    else:
        on = whole if whole in devices else next(iter(devices))
    shape = parse_shape(args.input_shape, "--input-shape")
    _old_overlay(args.out)
    load_model(args.model, None, "--model")
    corunner = None
    if args.corunner:
        if args.corunner_fbr is None or not 0 < args.corunner_fbr:
            raise UsageError("--corunner-fbr: required with --corunner, > 0 (Eq. 1 needs the co-runner's FBR)")
        cshape = (
            parse_shape(args.corunner_input_shape, "--corunner-input-shape") if args.corunner_input_shape else shape
        )
        cbatch = args.corunner_batch or args.batch
        if cbatch < 1:
            raise UsageError(f"--corunner-batch: must be >= 1, got {cbatch}")
        load_model(args.corunner, None, "--corunner")
        corunner = Workload(args.corunner, cshape, cbatch, args.input_dtype)
    elif args.corunner_fbr is not None or args.corunner_input_shape or args.corunner_batch:
        raise UsageError("--corunner: required with --corunner-fbr, --corunner-input-shape or --corunner-batch")
    return {
        "gpu": gpu,
        "gpu_flag": gpu.name if args.gpu and gpu.name != package_gpu else None,
        "devices": devices,
        "on": on,
        "workload": Workload(args.model, shape, args.batch, args.input_dtype),
        "corunner": corunner,
    }


def seven_g_sms(gpu: Any, device_name: str, nvml: Any | None = None) -> tuple[int | None, str]:
    """The 7g profile's SM count, and where it came from: NVML's GPU-instance profile info of a
    MIG-enabled GPU named `device_name` (read-only), else the package's MIG table for `gpu`."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                if name != device_name or nvml.nvmlDeviceGetMigMode(h)[0] != nvml.NVML_DEVICE_MIG_ENABLE:
                    continue
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, nvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
                if info.multiprocessorCount:
                    return int(info.multiprocessorCount), f"NVML's 7g profile info of GPU {i}"
        finally:
            nvml.nvmlShutdown()
    except Exception:  # no driver, no MIG-enabled GPU of this model: the package's table
        pass
    sms = int(getattr(gpu.profile(gpu.whole), "multiprocessors", 0) or 0)
    return (sms or None), f"the package's {gpu.name} MIG table"


def whole_baseline_s(plan: dict[str, Any], runs: dict[str, Run], nvml: Any | None = None) -> tuple[float, str | None]:
    """Solo(7g) for the RDFs: the 7g device's median, scaled by SMs when it is a whole GPU with more
    SMs than the 7g profile (time ~ 1/SMs for a batch that fills the GPU, an approximation; a 7g
    MIG slice in --devices needs none). Returns (seconds, a note of the scaling or None)."""
    gpu, whole = plan["gpu"], plan["gpu"].whole
    run, device = runs[whole], plan["devices"][whole]
    solo = median_s(run.times_s)
    if not device.is_whole_gpu or not run.sms:
        return solo, None
    sms_7g, source = seven_g_sms(gpu, run.device_name, nvml)
    if not sms_7g or sms_7g >= run.sms:
        return solo, None
    return solo * run.sms / sms_7g, f"7g baseline: the whole GPU's {run.sms} SMs scaled to {sms_7g} ({source})"


def _curve(args: argparse.Namespace, plan: dict[str, Any], env: dict[str, str] | None) -> dict[int, float]:
    """{k: T_k / T_0} on the --colocate-on device, T_0 measured in the same conditions (MPS or not)."""
    on, w = plan["on"], plan["workload"]
    device = plan["devices"][on]
    solo = median_s(co_located_times(w, device, 0, repeat=args.repeat, warmup=args.warmup, env=env).times_s)
    ratios = {}
    for k in range(1, args.max_corunners + 1):
        _note(f"{on}: beside {k} co-runner(s)")
        t = median_s(co_located_times(w, device, k, corunner=plan["corunner"], repeat=args.repeat,
                                      warmup=args.warmup, env=env).times_s)  # fmt: skip
        ratios[k] = t / solo
        _note(f"  median {t * 1000:.2f} ms, T_{k}/T_0 = {ratios[k]:.3f}")
    return ratios


def _measure(args: argparse.Namespace, plan: dict[str, Any]) -> dict[str, Any]:
    devices: dict[str, Device] = plan["devices"]
    w: Workload = plan["workload"]
    today = datetime.date.today().isoformat()
    runs = {}
    for key, device in devices.items():
        _note(f"{key} ({device.spec}): solo, {args.repeat} batches of {w.batch}")
        runs[key] = co_located_times(w, device, 0, repeat=args.repeat, warmup=args.warmup)
        _note(f"  median {median_s(runs[key].times_s) * 1000:.2f} ms on {runs[key].device_name}")

    def where(key: str) -> Measurement:
        return Measurement(f"{runs[key].device_name} ({devices[key].spec})", today, w.batch, args.repeat)

    whole = plan["gpu"].whole
    rdfs: dict[str, tuple[Fit, Measurement]] = {}
    baseline_s, scaled = whole_baseline_s(plan, runs) if whole in devices else (0.0, None)
    if scaled:
        _note(scaled)
    for key in devices:
        if key == whole:
            continue
        if whole in devices:
            fit = fit_rdf(median_s(runs[key].times_s), baseline_s)
        else:
            fit = Fit(None, f"no {whole} in --devices: RDF needs Solo on the whole GPU")
        rdfs[key] = (fit, where(key))
        _note(f"RDF {args.name}/{key}: {_shown(fit)}")

    fbr = None
    if args.max_corunners > 0:
        on = plan["on"]
        if devices[on].kind == "cuda" and args.mps:
            # its own daemon: co-runners share the SMs (without one they time-slice: a serial curve)
            with MPSSession(devices[on].visible) as mps:
                _note(f"{on}: MPS daemon for the co-location curve (pipes in {mps.pipe_dir})")
                ratios = _curve(args, plan, mps.client_env())
        else:
            ratios = _curve(args, plan, None)
        fit = fit_fbr(ratios, args.corunner_fbr)
        fbr = (fit, where(on))
        _note(f"FBR {args.name} on {on}: {_shown(fit)}")
    return overlay(args.name, rdfs, fbr, plan["gpu_flag"])


def _shown(fit: Fit) -> str:
    return f"{fit.value:.3f}" if fit.ok else f"refused: {fit.reason}"


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


HEADER = (
    "# Measured by `faas-gpu profile-colocation` (PROTEAN RDF and FBR, Eq. 1-2): an overlay of the\n"
    "# package's assumptions.yaml. Pass it as the scheduler's --protean-assumptions; `refused:` lists\n"
    "# numbers that were measured but did not fit, and why (the package's assumed values stay).\n"
)


def _old_overlay(out: Path | None) -> dict[str, Any] | None:
    """What --out holds already, if anything; refused unless this command wrote it (never the package's file)."""
    if out is None or not out.exists():
        return None
    try:
        old = yaml.safe_load(out.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"--out: {out} is not YAML: {exc}") from None
    if not isinstance(old, dict) or old.get("base") != "package":
        raise UsageError(f"--out: {out} is not an overlay this command wrote (no `base: package`); give another file")
    return old


def _write(out: Path | None, fragment: dict[str, Any]) -> str:
    """The overlay's text, merged into `out` if it holds one; checked to load through parse_assumptions."""
    from faas_gpu.policy_data.protean import parse_assumptions

    old = _old_overlay(out)
    if old is not None:
        fragment = merge_overlays(old, fragment)
    text = HEADER + yaml.safe_dump(fragment, sort_keys=False, default_flow_style=False)
    try:
        parse_assumptions(text)
    except (ValueError, KeyError) as exc:
        _note(f"note: the overlay does not load yet ({exc}); add the model's entry to it")
    if out is not None:
        out.write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
