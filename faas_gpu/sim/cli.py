"""`faas-gpu sim SCENARIO`: run a placement scenario and write CSV and PNG results."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from .engine import simulate
from .report import write_report
from .scenario import POLICIES, ScenarioError, load_scenario
from .trace import build_workload


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="faas-gpu sim", description=__doc__)
    p.add_argument("scenario", help="scenario YAML or JSON (see faas_gpu/sim/scenarios/)")
    p.add_argument("--policies", help=f"comma-separated, overriding the scenario's ({', '.join(POLICIES)})")
    p.add_argument("--o3-limit", type=int, help="skip limit for lalb_o3")
    p.add_argument("--out", type=Path, default=Path("sim-out"), help="folder for CSV and PNG (default sim-out)")
    p.add_argument(
        "--scale",
        type=float,
        help="multiply every minute of every function by this factor (default: the scenario's, 1 = as recorded)",
    )
    p.add_argument(
        "--reuse-functions",
        action="store_true",
        help="allow a working set larger than the trace's functions by taking them again at other minutes (printed)",
    )
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario)
        if args.scale is not None:
            if not args.scale > 0:
                raise ScenarioError(f"--scale: must be positive, got {args.scale}")
            scenario.trace.scale, scenario.trace.mean_requests_per_minute = args.scale, None
        if args.reuse_functions:
            scenario.trace.reuse_functions = True
        policies = args.policies.split(",") if args.policies else [scenario.policy]
        for name in policies:
            if name not in POLICIES:
                raise ScenarioError(f"--policies: unknown policy {name!r} ({', '.join(POLICIES)})")
        workload = build_workload(scenario.trace, scenario.models, scenario.seed)
        for note in workload.notes:
            print(note, file=sys.stderr)
        total = len(workload.arrivals) * len(policies)
        results = []
        with tqdm(total=total, unit="req", disable=args.no_progress, file=sys.stderr) as bar:
            for name in policies:
                bar.set_description(name)
                results.append(simulate(scenario, name, args.o3_limit, progress=bar.update, workload=workload))
    except ScenarioError as exc:
        print(f"faas-gpu sim: {exc}", file=sys.stderr)
        return 2
    files = write_report(results, args.out)
    for r in results:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.summary().items()}))
    print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr)
    return 0
