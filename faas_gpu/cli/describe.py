"""`faas-gpu describe`: faas-cli's description of a function, then faas-gpu's own view of its
instances (the autoscaler's decisions: batch, CPU, GPU share, rates; HarmonyBatch's groups)."""

from __future__ import annotations

import argparse

from faas_gpu.models.batch_limits import BatchLimits

from .common import CliError, add_common_flags, check, client_for, json_of, stack_of
from .listing import list_functions


def cmd_describe(args: argparse.Namespace) -> int:
    client = client_for(args, stack_of(args, required=False))
    params = {"usage": "1"}
    if args.namespace:
        params["namespace"] = args.namespace
    resp = client.request("GET", f"/system/function/{args.name}", params=params)
    if resp.status_code == 404:
        raise CliError(f"No such function: {args.name}")
    f = json_of(check(resp, (200,), f"describe {args.name}"), "describe")
    invocations = f.get("invocationCount") or 0
    for other in list_functions(client, args.namespace):  # faas-cli reads invocationCount from the list
        if other.get("name") == f.get("name"):
            invocations = other.get("invocationCount") or invocations
    suffix = f".{args.namespace}" if args.namespace else ""
    rows: list[tuple[str, object]] = [
        ("Name", f.get("name", args.name)),
        ("Status", _status_text(f)),
        ("Replicas", f.get("replicas") or 0),
        ("Available Replicas", f.get("availableReplicas") or 0),
        ("Invocations", int(invocations)),
        ("Image", f.get("image", "")),
        ("Function Process", f.get("envProcess") or "<default>"),
        ("URL", f"{client.gateway}/function/{args.name}{suffix}"),
        ("Async URL", f"{client.gateway}/async-function/{args.name}{suffix}"),
    ]
    for key, title in (
        ("labels", "Labels"),
        ("annotations", "Annotations"),
        ("envVars", "Environment"),
        ("constraints", "Constraints"),
        ("secrets", "Secrets"),
        ("requests", "Requests"),
        ("limits", "Limits"),
    ):
        value = f.get(key)
        if isinstance(value, dict) and value:
            rows.append((title, ", ".join(f"{k}: {v}" for k, v in sorted(value.items()))))
        elif isinstance(value, list) and value:
            rows.append((title, ", ".join(map(str, value))))
    usage = f.get("usage") or {}
    if usage.get("totalMemoryBytes"):
        rows.append(("RAM", f"{usage['totalMemoryBytes'] / 1024 / 1024:.2f} MB"))
    if usage.get("cpu") is not None and usage:
        rows.append(("CPU", f"{usage['cpu']:.0f} Mi"))
    for gap in usage.get("faasGpuUnmeasured") or []:  # the Swarm runtime: a replica whose node's engine it cannot read
        rows.append(("Not measured", f"{gap.get('instance')} on {gap.get('node')}: {gap.get('reason')}"))
    for m in f.get("faasGpuModels") or []:  # what batch each model the function uploaded accepts (issue 43)
        if isinstance(m, dict):
            batch = BatchLimits.from_json(m.get("batch")).text()
            digest = "".join(c for c in str(m.get("digest", ""))[:64] if c in "0123456789abcdef")[:12]
            rows.append(("Model batch", f"{digest}: batch: {batch}"))
    rollout = f.get("faasGpuRollout")
    if isinstance(rollout, dict) and rollout.get("state"):
        rows.insert(2, ("Rollout", f"{rollout['state']} ({rollout.get('message', '')})"))
    for k, v in rows:
        print(f"{k + ':':<20} {v}")
    ns_only = {"namespace": args.namespace} if args.namespace else {}
    resp = client.request("GET", f"/system/function/{args.name}/instances", params=ns_only)
    if resp.status_code == 200:
        _print_instances(json_of(resp, "describe instances"))
    return 0


def _status_text(f: dict) -> str:
    """Ready / Not Ready as faas-cli, faas-gpu's state of a function that cannot serve, or Idle for
    one asked to run no replica (scaled to zero: its next call starts one)."""
    problem = f.get("faasGpuStatus")
    if isinstance(problem, dict) and problem.get("state"):
        return f"{problem['state']} ({problem.get('message', '')})"
    if (f.get("availableReplicas") or 0) > 0:
        return "Ready"
    return "Idle (scaled to zero: its next call starts a replica)" if f.get("replicas") == 0 else "Not Ready"


def _print_instances(d: dict) -> None:
    """The autoscaler's decisions for a managed function: one row per (non-uniform) instance."""
    if not d.get("managed"):
        return
    if d.get("policy") == "harmonybatch":
        _print_groups(d)
        return
    if d.get("policy") == "protean":
        print(
            f"{'Scaling:':<20} protean: one container per batch of {d.get('batch')}; {d.get('requests', 0)} "
            f"requests in flight at the last tick need {d.get('needed', 0)}, {d.get('replicas', 0)} desired; "
            f"surplus ones stop after {d.get('surplusWindowS', 0):g} s"
        )
        for i in d.get("instances") or []:
            print(f"  {i['id']:<36} ready: {'yes' if i.get('ready') else 'no'}")
        return
    ka = d.get("keepAlive") or {}
    effort = ", best effort" if d.get("bestEffort") else ""
    print(f"{'Model:':<20} {d.get('model')} (SLO {d.get('sloMs'):g} ms{effort})")
    if d.get("profile"):
        print(f"{'Profile:':<20} {d['profile']}")
    span = f"[{d.get('rMin', 0):g}, {d.get('rMax', 0):g}]"
    print(f"{'Load:':<20} {d.get('rps', 0):.1f} rps; instances take {span} ({d.get('case')})")
    _print_capacity(d.get("capacity"))
    if ka.get("scaleZero"):
        windows = f"pre-warm {ka.get('prewarmS', 0):g} s, keep-alive {ka.get('keepAliveS', 0):g} s, scale to zero"
    else:
        windows = (
            'never below com.openfaas.scale.min; com.openfaas.scale.zero: "true" (or com.faas-gpu.scale-zero, '
            "pre-warmed) lets it idle to zero"
        )
    print(f"{'Keep-alive:':<20} {ka.get('policy')} ({windows})")
    head = ("INSTANCE", "B", "CPU", "GPU%", "EXEC ms", "R_LOW", "R_UP", "RATE")
    print("{:<28} {:>3} {:>4} {:>5} {:>8} {:>6} {:>6} {:>7}  READY".format(*head))
    for i in d.get("instances") or []:
        print(
            f"{i['id']:<28} {i['batch']:>3} {i['cpu']:>4g} {i['gpuShare']:>5g} {i['tExecMs']:>8.2f} "
            f"{i['rLow']:>6g} {i['rUp']:>6g} {i['rate']:>7.1f}  {'yes' if i.get('ready') else 'no'}"
        )


def _print_capacity(cap: dict | None) -> None:
    """Predicted against observed capacity, and the path cost the prediction counts."""
    if not cap:
        return
    observed = cap.get("observedRps")
    seen = "not yet saturated" if observed is None else f"{observed:g} rps observed at saturation"
    fix = cap.get("correction", 1.0)
    path_fix = cap.get("pathCpuCorrection", 1.0)
    fixed = f"; path CPU on the node corrected x{path_fix:g}" if path_fix and path_fix != 1.0 else ""
    fixed += f"; model corrected x{fix:g} from what was observed" if fix and fix != 1.0 else ""
    print(f"{'Capacity:':<20} {cap.get('predictedRps', 0):g} rps predicted, {seen}{fixed}")
    path = cap.get("pathCostMs")
    if path is None:
        what = "not measured: run `faas-gpu profile --path` (model time alone is predicted)"
    else:
        what = (
            f"{path['fixed']:g} ms a batch + {path['perRequest']:g} ms a request (faas-gpu profile --path), "
            "its CPU reserved on the node for every instance's r_up"
        )
    print(f"{'Path cost:':<20} {what}")


def _print_groups(d: dict) -> None:
    """HarmonyBatch's plan: the apps, and one pool per group with its batch and per-app timeouts."""
    apps = ", ".join(f"{a['name']} ({a['sloMs']:g} ms, {a['rate']:.1f} rps)" for a in d.get("apps") or [])
    print(f"{'Plan:':<20} harmonybatch ({d.get('strategy')}), model {d.get('model')}; apps {apps}")
    cost = d.get("predictedCostPerRequest")
    if cost is not None:
        print(f"{'Predicted cost:':<20} {cost:.4g} per request, {d.get('predictedCostPerSecond') or 0:.4g} per second")
    for g in d.get("instances") or []:
        size = f"{g['vcpu']:g} vCPU" if g["kind"] == "cpu" else f"{g['gpuMemoryGb']} GB GPU"
        timeouts = ", ".join(f"{k} {v:g} ms" for k, v in sorted(g["timeoutsMs"].items()))
        print(f"  {g['id']:<36} {g['kind']:<4} {size:<12} batch {g['batch']:<3} {'+'.join(g['apps'])}; {timeouts}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("describe", help="describe a function")
    add_common_flags(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.set_defaults(func=cmd_describe)
