"""What the status page shows, gathered by the provider from what it already knows.

- functions: the provider's function store, its invocation counters, and the gateway's recent
  activity (`provider.activity`: rate, SLO tally);
- GPU units, their cached models and running job, cordoned nodes, the scheduler leader and its
  members: the datastore, where the GPU Managers report their units and the schedulers announce
  themselves (`faas_gpu.contract.keys`); models are digests, named by the functions that uploaded
  them (`keys.FN_MODELS`);
- queues and the last MIG reconfigurations: the scheduler leader's `/v1/status`, which takes the
  cluster token. The provider does not hold that token of its own; it reads it only where it lies
  in the provider's secrets folder (one state folder for the whole stack, as `faas-gpu up` and the
  compose file run it). Without it those parts say why they are missing and the rest still shows;
- procurement: the procurer's status file (`<home>/procurement.json`) when there is one.

Every part is gathered on its own: a datastore or scheduler that does not answer leaves its part
empty with the reason, never the whole page. Each value read from elsewhere is coerced to the
type the page expects (a report in the datastore is another process's text).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import requests

from faas_gpu.contract import keys
from faas_gpu.credentials import TOKEN_FILE
from faas_gpu.datastore import Datastore
from faas_gpu.schedulers import announced

from ..core import Provider

log = logging.getLogger(__name__)

RECENT_EVENTS = 10
"""Procurement events and MIG reconfigurations shown: the last ones."""
SCHEDULER_TIMEOUT_S = (0.5, 1.5)
"""(connect, read) for a scheduler's /v1/status: the page must answer while a scheduler is away."""


def _str(value: object, limit: int = 200) -> str:
    return str(value)[:limit]


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class StatusCollector:
    """Builds the page's JSON; at most one collection per `min_interval_s`, however many pages
    poll (each collection reads the datastore and may call the scheduler)."""

    def __init__(
        self,
        provider: Provider,
        *,
        min_interval_s: float = 1.0,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.provider = provider
        self.min_interval_s = min_interval_s
        self.session = session or requests.Session()
        self.clock, self.wall = clock, wall
        self._lock = threading.Lock()
        self._last: tuple[float, dict] | None = None

    def __call__(self) -> dict:
        with self._lock:
            now = self.clock()
            if self._last is not None and now - self._last[0] < self.min_interval_s:
                return self._last[1]
            out = self.collect()
            self._last = (self.clock(), out)
            return out

    # -- the whole page ------------------------------------------------------------------
    def collect(self) -> dict:
        p = self.provider
        ds_error: str | None = None
        try:
            cluster = read_cluster(p.datastore)
        except Exception as exc:  # noqa: BLE001 — DatastoreUnavailable, or a backend error: say so
            ds_error, cluster = str(exc) or type(exc).__name__, Cluster()
        scheduler = self.scheduler(cluster.members) if p.config.scheduler_url or cluster.members else None
        unit_queues = None  # unknown unless a scheduler answered
        if scheduler is not None and "error" not in scheduler:
            queues = scheduler.get("queues") if isinstance(scheduler.get("queues"), dict) else {}
            unit_queues = queues.get("units") if isinstance(queues.get("units"), dict) else {}
        return {
            "generatedAt": round(self.wall(), 3),
            "datastore": {"ok": ds_error is None, **({"error": ds_error} if ds_error else {})},
            "functions": self.functions(),
            "units": [unit_view(u, cluster.owners, cluster.cordons, unit_queues) for u in cluster.units],
            "cordons": [{"node": _str(n), "reason": _str(c.get("reason", ""))} for n, c in cluster.cordons.items()],
            "scheduler": scheduler_view(scheduler, cluster),
            "reconfigurations": reconfigurations(scheduler),
            "procurement": procurement_view(self.procurement_file()),
        }

    # -- functions -----------------------------------------------------------------------
    def functions(self) -> dict:
        p = self.provider
        try:
            records = p.store.list()
            error = None
        except Exception as exc:  # noqa: BLE001 — the datastore away: the records this provider last saw
            records = [r for r in (p.store.cached(*k) for k in list(p.invoker.counts)) if r is not None]
            error = str(exc) or type(exc).__name__
        items = []
        default_ns = p.config.namespaces[0]
        for record in sorted(records, key=lambda r: r.key):
            status = p.status(record)
            seen = p.activity.view(record.key)
            met, missed = seen["slo"]["met"], seen["slo"]["missed"]
            problem = status.get("faasGpuStatus") or {}
            rollout = status.get("faasGpuRollout") or {}
            available = int(status.get("availableReplicas") or 0)
            suffix = "" if record.namespace == default_ns else f".{record.namespace}"
            items.append(
                {
                    "name": record.name,
                    "namespace": record.namespace,
                    "image": record.deployment.image,
                    "replicas": record.replicas,
                    "availableReplicas": available,
                    "invocations": int(status.get("invocationCount") or 0),
                    "ratePerSecond": seen["ratePerSecond"],
                    "sloMs": record.deployment.slo_ms(),
                    "slo": {
                        "met": met,
                        "missed": missed,
                        "attainment": round(met / (met + missed), 4) if met + missed else None,
                    },
                    "state": function_state(problem, available, record.replicas),
                    "message": _str((problem or rollout).get("message", ""), 500),
                    "rollout": _str(rollout.get("state", "")),
                    "invokeName": record.name + suffix,
                }
            )
        # recording False (`--no-metrics`): rates and SLO tallies stay zero, not measured as zero
        return {"items": items, "recording": p.config.metrics, **({"error": error} if error else {})}

    # -- the scheduler -------------------------------------------------------------------
    def scheduler_urls(self, members: list[str]) -> list[str]:
        configured = [u.strip().rstrip("/") for u in (self.provider.config.scheduler_url or "").split(",")]
        urls = [u for u in configured if u]
        return urls + [u.rstrip("/") for u in members if u.rstrip("/") not in urls]

    def token(self) -> str | None:
        """The cluster token, when it lies in the provider's secrets folder (never created here)."""
        try:
            return (self.provider.config.secrets_dir / TOKEN_FILE).read_text().strip() or None
        except OSError:
            return None

    def scheduler(self, members: list[str]) -> dict:
        """The leader's /v1/status (else the last replica that answered), with `url`; or
        `{"error": ...}` saying why there is none."""
        token = self.token()
        if token is None:
            return {"error": "the cluster token is not in the provider's secrets folder"}
        answered: dict | None = None
        errors = []
        for url in self.scheduler_urls(members):
            try:
                r = self.session.get(
                    f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=SCHEDULER_TIMEOUT_S
                )
                r.raise_for_status()
                body = r.json()
            except (requests.RequestException, ValueError) as exc:
                errors.append(f"{url}: {exc}")
                continue
            if not isinstance(body, dict):
                continue
            answered = {**body, "url": url}
            if body.get("leader") is True:
                return answered
        if answered is not None:
            return answered
        return {"error": "; ".join(errors) or "no scheduler known"}

    def procurement_file(self) -> Path:
        return self.provider.config.home / "procurement.json"


def function_state(problem: dict, available: int, desired: int) -> str:
    """What the status page's badge says: faas-gpu's state of a function that cannot serve, else
    Ready, else Idle for one that runs no replica on purpose (scaled to zero: its next call starts
    one), else Not Ready (replicas asked for and none ready yet)."""
    if problem:
        return _str(problem.get("state"))
    if available:
        return "Ready"
    return "Idle" if desired == 0 else "Not Ready"


class Cluster:
    """One read of the datastore's cluster keys."""

    def __init__(
        self,
        units: list[dict] | None = None,
        cordons: dict[str, dict] | None = None,
        owners: dict[str, list[str]] | None = None,
        leader: str | None = None,
        members: list[str] | None = None,
    ):
        self.units = units or []
        self.cordons = cordons or {}
        self.owners = owners or {}
        self.leader = leader
        self.members = members or []


def read_cluster(ds: Datastore) -> Cluster:
    """Unit reports, cordons, which function uploaded each model, the scheduler leader and members."""
    units = []
    for kv in ds.get_prefix(keys.UNITS):
        try:
            report = json.loads(kv.value)
        except ValueError:
            continue
        if isinstance(report, dict):
            units.append(report)
    units.sort(key=lambda u: (_str(u.get("node")), _str(u.get("unit"))))
    cordons: dict[str, dict] = {}
    for kv in ds.get_prefix(keys.CORDON):
        try:
            info = json.loads(kv.value)
        except ValueError:
            info = {}
        cordons[kv.key[len(keys.CORDON) :]] = info if isinstance(info, dict) else {}
    owners: dict[str, list[str]] = {}
    for kv in ds.get_prefix(keys.FN_MODELS):
        parts = kv.key[len(keys.FN_MODELS) :].split("/")
        if len(parts) == 3 and parts[2]:
            ns, name, digest = unquote(parts[0]), unquote(parts[1]), parts[2]
            owners.setdefault(digest, []).append(f"{name}.{ns}")
    leader = ds.get(keys.SCHEDULER_LEADER)
    owned = {d: sorted(f) for d, f in owners.items()}
    return Cluster(units, cordons, owned, leader.value.decode() if leader else None, announced(ds))


def _model(digest: object, owners: dict[str, list[str]]) -> dict:
    d = _str(digest)
    return {"digest": d, "functions": owners.get(d, [])}


def unit_view(
    report: dict, owners: dict[str, list[str]], cordons: dict[str, dict], queues: dict | None
) -> dict[str, Any]:
    """One unit as the page shows it; `queues`: the scheduler's jobs per unit key (None: unknown)."""
    node, unit = _str(report.get("node")), _str(report.get("unit"))
    key = f"{node}/{unit}"
    models = report.get("models") if isinstance(report.get("models"), list) else []
    running = report.get("running")
    queued = queues.get(key, 0) if queues is not None else None
    return {
        "key": key,
        "node": node,
        "unit": unit,
        "kind": _str(report.get("kind", "")),
        "name": _str(report.get("name", "")),
        "gpuName": _str(report.get("gpu_name") or ""),
        "profile": _str(report["profile"]) if report.get("profile") else None,
        "memoryMb": _num(report.get("memory_mb")),
        "usedMb": _num(report.get("used_mb")),
        "state": _str(report.get("state", "")),
        "busyForS": _num(report.get("busy_for_s")),
        "running": _model(running, owners) if running else None,
        "models": [_model(m, owners) for m in models[:100]],
        "queued": int(queued) if isinstance(queued, int) else None,
        "cordoned": node in cordons,
    }


def scheduler_view(status: dict | None, cluster: Cluster) -> dict[str, Any]:
    """The leader (from the datastore's lease), the replicas announced, and the leader's queues."""
    out: dict[str, Any] = {
        "configured": status is not None,
        "leaderId": _str(cluster.leader) if cluster.leader else None,
        "members": [_str(m) for m in cluster.members],
    }
    if status is None:
        return out
    if "error" in status:
        return {**out, "error": _str(status["error"], 1000)}
    queues = status.get("queues") if isinstance(status.get("queues"), dict) else {}
    return {
        **out,
        "url": _str(status.get("url", "")),
        "answeredByLeader": status.get("leader") is True,
        "leaderId": _str(status.get("leader_id")) if status.get("leader_id") else out["leaderId"],
        "queued": _num(status.get("queued")),
        "queues": {
            "strict": _num(queues.get("strict")),
            "bestEffort": _num(queues.get("best-effort")),
        },
        "deadlineMisses": _num(status.get("deadline_misses")),
        "lateDropped": _num(status.get("late_dropped")),
        "distribution": _str(status.get("distribution", "")),
        "uploading": [upload_view(u) for u in _dicts(status.get("uploading"))],
        "models": [model_state_view(m, cluster.owners) for m in _dicts(status.get("models"))],
    }


def _dicts(value: object, limit: int = 100) -> list[dict]:
    return [v for v in value[-limit:] if isinstance(v, dict)] if isinstance(value, list) else []


def upload_view(u: dict) -> dict[str, Any]:
    """An upload the scheduler is receiving from a function's GPU client (`scheduler.model_states`)."""
    return {
        "function": _str(u.get("function", "")),
        "bytes": _num(u.get("bytes")),
        "total": _num(u.get("total")),
        "seconds": _num(u.get("s")),
    }


def model_state_view(m: dict, owners: dict[str, list[str]]) -> dict[str, Any]:
    """Where a model's cold start stands on the scheduler: uploaded, copying to a unit's manager,
    loaded (with its load time); the functions that uploaded it."""
    model = _model(m.get("digest", ""), owners)
    function = _str(m.get("function", ""))
    if function and function not in model["functions"]:
        model["functions"] = [*model["functions"], function]
    return {
        **model,
        "state": _str(m.get("state", "")),
        "size": _num(m.get("size")),
        "unit": _str(m["unit"]) if m.get("unit") else None,
        "loadS": _num(m.get("load_s")),
        "uploadS": _num(m.get("upload_s")),
    }


def reconfigurations(status: dict | None) -> list[dict]:
    """The GPU Reconfigurator's last outcomes, newest first (empty without a reconfigurator)."""
    reconfig = (status or {}).get("reconfigurator")
    recent = reconfig.get("recent") if isinstance(reconfig, dict) else None
    if not isinstance(recent, list):
        return []
    out = []
    for o in reversed(recent[-RECENT_EVENTS:]):
        if isinstance(o, dict):
            out.append(
                {
                    "gpu": _str(o.get("gpu", "")),
                    "from": [_str(x) for x in o.get("from") or []],
                    "to": [_str(x) for x in o.get("to") or []],
                    "status": _str(o.get("status", "")),
                    "detail": _str(o.get("detail") or "", 500),
                }
            )
    return out


def procurement_view(path: Path) -> dict[str, Any]:
    """The procurer's nodes, cost and last events from its status file; `available: False` without one."""
    try:
        status = json.loads(path.read_text())
    except FileNotFoundError:
        return {"available": False, "reason": "no procurer status file"}
    except (OSError, ValueError) as exc:
        return {"available": False, "reason": f"{path.name}: {exc}"}
    if not isinstance(status, dict):
        return {"available": False, "reason": f"{path.name}: not a JSON object"}
    cost = status.get("cost") if isinstance(status.get("cost"), dict) else {}
    nodes = status.get("nodes") if isinstance(status.get("nodes"), list) else []
    events = status.get("events") if isinstance(status.get("events"), list) else []
    return {
        "available": True,
        "updated": _num(status.get("updated")),
        "mode": _str(status.get("mode", "")),
        "targetNodes": _num(status.get("targetNodes")),
        "nodes": [
            {"id": _str(n.get("id", "")), "kind": _str(n.get("kind", "")), "state": _str(n.get("state", ""))}
            for n in nodes
            if isinstance(n, dict)
        ],
        "dollars": _num(cost.get("total")),
        "savings": _num(cost.get("savings")),
        "events": [
            {
                "t": _num(e.get("t")),
                "event": _str(e.get("event", "")),
                "node": _str(e.get("node", "")),
                "detail": " ".join(f"{k}={_str(v, 80)}" for k, v in e.items() if k not in ("t", "event", "node"))[:300],
            }
            for e in reversed(events[-RECENT_EVENTS:])
            if isinstance(e, dict)
        ],
    }
