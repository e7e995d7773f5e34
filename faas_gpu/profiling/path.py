"""The serving path's own cost on this node, for INFless's capacity model (`faas-gpu profile --path`).

A deployed function whose handler calls a profiled model is copied once per batch size with the model client's
batching pinned (`FAAS_GPU_MAX_BATCH` 1 and b, plain replicas, no INFless sizing); each copy is
driven at saturation (closed loop, max(16, 2b) clients), the copies in turn and twice over (the best
round of each kept) through the gateway, so every part of the path —
gateway, watchdog, handler and client, scheduler, GPU Manager, worker — is on the clock. At each
batch size the path's seconds per batch are what the batch took beyond the model's own time:

    path(b) = b_mean / throughput - t_model(b_mean)

with b_mean the batch sizes the replies report (`X-Faas-Gpu-Batch`) and t_model the profile
store's prediction. `PathCost.fit` (the policy's own fit) splits the points into a fixed part
per batch and a part per request; the store keeps them per node (`ProfileStore.put_path_cost`)
and INFless's autoscaler adds them to t_exec (`faas_gpu.policies.infless.path`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from faas_gpu.contract import env as contract_env
from faas_gpu.contract import headers as h
from faas_gpu.policies.infless import PathCost

PROBE_SUFFIX = "-path-probe"


@dataclass(frozen=True)
class PathPoint:
    batch_cap: int
    mean_batch: float
    rps: float
    model_s: float

    @property
    def path_s(self) -> float:
        """The path's seconds per batch at this point (never below 0)."""
        return max(0.0, self.mean_batch / self.rps - self.model_s) if self.rps > 0 else 0.0


def drive(url: str, body: bytes, clients: int, seconds: float, headers: dict[str, str] | None = None):
    """Closed loop: `clients` keep-alive callers for `seconds`; (answers per second, batch sizes seen)."""
    batches: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    errors: list[str] = []

    def one() -> None:
        s = requests.Session()
        mine: list[int] = []
        while time.monotonic() < stop:
            r = s.post(url, data=body, headers=headers or {"Content-Type": "application/json"}, timeout=60)
            if r.status_code != 200:
                errors.append(f"{r.status_code} {r.text[:200]}")
                return
            mine.append(int(r.headers.get(h.BATCH, "1") or 1))
        with lock:
            batches.extend(mine)

    t0 = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{url}: {errors[0]}")
    return len(batches) / (time.monotonic() - t0), batches


def probe_deployment(function: dict, batch: int, timeout_ms: float) -> dict:
    """A copy of `function` (the provider's record) that batches at most `batch`, plainly replicated."""
    annotations = {k: v for k, v in (function.get("annotations") or {}).items() if not k.startswith("com.faas-gpu.")}
    env = dict(function.get("envVars") or {})
    env[contract_env.MAX_BATCH.name] = str(batch)
    env[contract_env.BATCH_TIMEOUT_MS.name] = f"{timeout_ms:g}"
    return {
        "service": function["name"] + PROBE_SUFFIX,
        "image": function["image"],
        "envVars": env,
        "annotations": annotations,
        "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "1"},
    }


def measure(
    gateway: str,
    auth: tuple[str, str] | None,
    function: str,
    model_ms: Callable[[int], float],
    *,
    batches: tuple[int, ...] = (1, 8),
    body: bytes = b'{"seed": 1}',
    seconds: float = 5.0,
    rounds: int = 2,
    ready_timeout_s: float = 180.0,
    log: Callable[[str], None] = print,
) -> tuple[PathCost, list[PathPoint]]:
    """Deploy a probe per batch size, drive them in turn for `rounds` rounds (each batch size's best
    round is kept: on a shared machine the fastest round is the one least disturbed), fit; the
    probes are removed again."""
    s = requests.Session()
    s.auth = auth
    r = s.get(f"{gateway}/system/function/{function}", timeout=10)
    if r.status_code != 200:
        raise LookupError(f"function {function!r}: {r.status_code} {r.text.strip()[:200]} (deploy it first)")
    record = r.json()
    names = {b: f"{function}{PROBE_SUFFIX}-b{b}" for b in batches}
    best: dict[int, tuple[float, float]] = {}
    try:
        for b, name in names.items():
            dep = probe_deployment(record, b, timeout_ms=20.0)
            dep["service"] = name
            s.delete(f"{gateway}/system/functions", json={"functionName": name}, timeout=30)
            r = s.post(f"{gateway}/system/functions", json=dep, timeout=60)
            if r.status_code not in (200, 202):
                raise RuntimeError(f"deploying {name}: {r.status_code} {r.text.strip()[:200]}")
        for name in names.values():
            _wait_ready(s, gateway, name, body, ready_timeout_s)
        for _ in range(max(1, rounds)):
            for b, name in names.items():
                url = f"{gateway}/function/{name}"
                clients = max(16, 2 * b)  # enough in flight to saturate every hop, and to fill batches
                drive(url, body, clients, 1.0)  # warm: the model loaded, the connections open
                rps, seen = drive(url, body, clients, seconds)
                mean = sum(seen) / len(seen) if seen else 1.0
                log(f"  batch <= {b}: {rps:.0f} requests/s, mean batch {mean:.1f}")
                if rps > best.get(b, (0.0, 0.0))[0]:
                    best[b] = (rps, mean)
    finally:
        for name in names.values():
            s.delete(f"{gateway}/system/functions", json={"functionName": name}, timeout=30)
    points = []
    for b, (rps, mean) in best.items():
        point = PathPoint(b, mean, rps, model_ms(max(1, round(mean))) / 1000.0)
        points.append(point)
        log(
            f"  kept batch <= {b}: {rps:.0f} requests/s, mean batch {mean:.1f}: {point.path_s * 1000:.2f} ms of "
            f"path a batch beside {point.model_s * 1000:.2f} ms of model"
        )
    return PathCost.fit([(p.mean_batch, p.path_s) for p in points]), points


def _wait_ready(s: requests.Session, gateway: str, name: str, body: bytes, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            r = s.post(f"{gateway}/function/{name}", data=body, timeout=30)
            if r.status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{name}: not answering after {timeout_s:g} s")


def points_json(points: list[PathPoint]) -> str:
    return json.dumps(
        [{"batch": p.mean_batch, "rps": round(p.rps, 1), "pathMs": round(p.path_s * 1000, 3)} for p in points]
    )
