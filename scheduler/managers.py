"""The scheduler's client of the GPU Managers' HTTP API: run a job on a unit, re-slice a GPU.

One place for what the managers' answers mean to the scheduler, so the leader loop and the GPU
Reconfigurator decide on outcomes, never on status codes and headers:
- `POST /v1/jobs/<digest>?unit=`: a manager that has not got the model yet is sent the artifact
  and asked again (the manager's 404 carries the code `model-not-uploaded`, never read from its
  text); a unit that says it is draining or gone (`X-Faas-Gpu-Unit-State`) raises
  `UnitUnavailable`, a manager in trouble (5xx but 507) raises `requests.HTTPError`: both mean
  "place the job again".
- `POST /v1/gpus/<i>/geometry`: done, invalid (400: the manager cannot take the geometry),
  forbidden (403: the manager may not change MIG geometry at all), refused (409: units did not
  drain, or a destroy was refused as in use, with `Retry-After`; 5xx) or unreachable; the last
  two are worth trying again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import requests

from faas_gpu import tracing
from faas_gpu.contract import headers as h
from faas_gpu.contract.errors import ModelNotUploaded, code_of
from faas_gpu.models import ModelStore

from .jobs import Job, JobOutcome
from .units import UnitRef


class UnitUnavailable(requests.RequestException):
    """The manager says the unit is draining for a reconfiguration or no longer exists."""


class ManagerClient:
    def __init__(
        self,
        store: ModelStore,
        token: str,
        http: requests.Session | None = None,
        on_copy: Callable[[str, str], None] | None = None,
        on_loaded: Callable[[str, str, float], None] | None = None,
    ):
        """Told of a cold start only (`scheduler.model_states`): `on_copy(digest, unit key)` before a
        model is sent to a manager that lacks it, `on_loaded(digest, unit key, load s)` when a job
        was answered after its model was loaded (a cache miss; the placement loop tells it, having
        read the answer's cache header already)."""
        self.store, self.token = store, token
        self.http = http or requests.Session()
        self.on_copy, self.on_loaded = on_copy, on_loaded

    def run_job(self, unit: UnitRef, job: Job) -> requests.Response:
        """The manager's answer to `job` on `unit` (200, or a 4xx or 507 the caller is told)."""
        auth = {"Authorization": f"Bearer {self.token}"}
        url = f"{unit.url}/v1/jobs/{job.digest}"
        headers = tracing.inject({**auth, h.FUNCTION: job.function} if job.function else dict(auth))
        for _ in range(2):
            r = self.http.post(url, params={"unit": unit.unit}, data=job.payload, headers=headers, timeout=300)
            if r.status_code == 404 and code_of(r.headers) == ModelNotUploaded.code:
                artifact = self.store.get(job.digest)
                if self.on_copy is not None:
                    self.on_copy(job.digest, unit.key)
                with open(artifact.path, "rb") as fh:
                    up = self.http.put(f"{unit.url}/v1/models", data=fh, headers=auth, timeout=300)
                up.raise_for_status()
                continue
            break
        if r.headers.get(h.UNIT_STATE) in h.UNIT_STATES:
            raise UnitUnavailable(f"unit {unit.key}: {r.headers[h.UNIT_STATE]} ({r.text.strip()[:200]})")
        if r.status_code >= 500 and r.status_code != 507:
            r.raise_for_status()  # a manager in trouble: place the job again
        return r


def measured(r: requests.Response) -> tuple[bool, float, float]:
    """What a manager measured running a job: (model cache hit, load s, execute s)."""
    load_s = float(r.headers.get(h.LOAD_SECONDS, 0))
    exec_s = float(r.headers.get(h.EXECUTE_SECONDS, 0))
    return r.headers.get(h.CACHE) == "hit", load_s, exec_s


def model_mb(r: requests.Response) -> float | None:
    """The model's measured cost on the unit, as the manager charges it (None from an older manager)."""
    try:
        return float(r.headers[h.MODEL_MB])
    except (KeyError, ValueError):
        return None


def job_outcome(r: requests.Response, queue_s: float) -> JobOutcome:
    """The caller's answer: the manager's status, body and `X-Faas-Gpu-*` headers, and the time
    the job spent with the scheduler."""
    headers = h.ours(r.headers)
    headers[h.QUEUE_SECONDS] = f"{queue_s:.6f}"
    return JobOutcome(r.status_code, r.content, headers)


class GeometryAnswer(NamedTuple):
    """A manager's answer to a new geometry, as the Reconfigurator acts on it."""

    status: str  # "done" | "invalid" | "refused" | "forbidden" | "unreachable" | "error"
    detail: str
    retry: bool  # worth trying again (the policy still wanting it)
    retry_after_s: float | None = None  # not before this many seconds (the manager's Retry-After)


def set_geometry(
    http: Any, token: str, url: str, index: int, profiles: list[str], drain_timeout_s: float
) -> GeometryAnswer:
    """Ask the manager at `url` to re-slice its GPU `index` into `profiles` (NVML's names).

    400: the GPU cannot take it ("invalid"); 403: the manager may not change MIG geometry at all
    (not root, no mig-config capability: "forbidden", never retried, it would drain for nothing);
    409 and 5xx: "refused", worth a retry, not before the manager's `Retry-After` where it gives one
    (a destroy NVML refused as in use, undone)."""
    body = {"profiles": profiles, "drain_timeout_s": drain_timeout_s}
    try:
        resp = http.post(
            f"{url}/v1/gpus/{index}/geometry",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=drain_timeout_s + 60,
        )
        detail = resp.text.strip()[:300]
        if resp.status_code == 200:
            return GeometryAnswer("done", detail, False)
        if resp.status_code == 400:
            return GeometryAnswer("invalid", detail, False)
        if resp.status_code == 403:
            return GeometryAnswer("forbidden", detail, False)
        if resp.status_code == 409 or resp.status_code >= 500:
            return GeometryAnswer("refused", detail, True, _retry_after(resp.headers.get("Retry-After")))
        return GeometryAnswer("error", detail, False)
    except requests.RequestException as exc:
        return GeometryAnswer("unreachable", str(exc)[:300], True)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is not one a manager sends)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
