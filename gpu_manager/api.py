"""The GPU Manager's HTTP API: upload a model artifact, run a job (binary tensors), read status,
list the GPUs and change a GPU's MIG geometry.

- `GET /v1/gpus`: [{index, uuid, name, memory_mb, mig_mode ("enabled" | "disabled" |
  "unsupported"), geometry: ["4g.20gb", "3g.20gb"], instances: [{id, profile, placement:
  {start, size}, compute_instances}], profiles: [{name, id, nvml_profile, slices, memory_mb,
  max_count, multiprocessors, placements}], units: [unit ids], mps: bool, mig_control: bool,
  mig_control_reason}]; `memory_mb` is NVML v2's usable memory (total - reserved), null where
  NVML refuses it (a MIG-mode GPU's own figure needs privilege; its units' figures do not).
- `POST /v1/gpus/<index>/geometry` {"profiles": ["4g.20gb", "2g.10gb", "1g.5gb"],
  "drain_timeout_s": 30}: 200 {gpu, geometry, units: [unit status]}; 400 {error,
  valid_profiles: {name: max count}, valid_geometries: [[...]]} for a geometry the GPU cannot
  take; 403 when this manager may not change MIG geometry (not root, no mig-config capability:
  checked before anything is drained; the scheduler does not retry it); 409 when MIG mode is off,
  the units did not drain in time, or NVML refused a destroy as in use with no process visible
  (undone, with `Retry-After`); 404 for no such GPU.
- `POST /v1/jobs/<digest>?unit=<id>` on a unit that is draining (503) or not a unit of this node
  (404) answers `X-Faas-Gpu-Unit-State: draining | unknown`, so the scheduler places it again.

- `POST /v1/jobs/<digest>` and memory: out of memory is never the caller's error. A load or a
  batch that runs out evicts the unit's other models and is tried once more; then 507 (it does
  not fit even alone) or 503 (it was measured to fit: memory held elsewhere, retry later). A
  device fault (a lost CUDA context) replaces the worker (and under MPS the unit's daemon and
  workers) and retries once, else 503. Each answer carries `X-Faas-Gpu-Model-Mb`, the model's
  measured cost on the unit.

- `PUT /v1/models`: stored, then (with `--prepared-mb`) prepared in the background for the least
  loaded unit: a worker reads and checks it into host memory, so the miss that follows pays only
  the copy to the device and the warm-up (`GPUManager.uploaded`).

- `GET /metrics`: Prometheus's text format (`faas_gpu.contract.metrics`: Triton's `nv_gpu_*` per
  unit, the model cache per unit, MIG reconfigurations), with the cluster token like `/v1/`.

- `GET /v1/functions`: {"name.namespace": jobs run}, from the `X-Faas-Gpu-Function` header the
  scheduler sets on a function's jobs (accounting only: it grants nothing).

Every /v1/ route needs `Authorization: Bearer <token>`, the cluster token (the node's token file):
the API is for the scheduler and the daemons. Functions' replicas hold only their own token,
which the scheduler checks and which is refused here (401) but on one route: `POST /v1/jobs/<digest>`
with `X-Faas-Gpu-Lease`, a placement lease the scheduler signed for that token, model and unit
(`faas_gpu.contract.lease`), runs the job (a lease refused is 401 with the code `lease-refused`:
the instance sends the batch through the scheduler instead). A leased job never loads its model:
one not loaded on the unit is answered 409, and goes through the scheduler.

A batch the model does not accept (its first dimension outside the batch its archive declares,
`faas_gpu.models.batch_limits`: a static batch of 1 sent 3 rows) is answered 400, code
`batch-refused`, naming `shape[0]` and the batch the model accepts, before the job waits for its
unit or loads anything: the scheduler answers the same, but a leased batch comes here directly.

A job may carry the budget left of its SLO (`X-Faas-Gpu-Deadline-Ms`, which the instance sends
with a leased batch): it becomes a deadline when the job arrives, and a job still waiting for its
unit then is answered as the scheduler answers a late job (504, `X-Faas-Gpu-Deadline-Missed:
true`, code `deadline-missed`), never run late.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from flask import Flask, Response, jsonify, request

from faas_gpu import tracing
from faas_gpu.contract import headers as h
from faas_gpu.contract.errors import (
    ArtifactError,
    ArtifactTooLarge,
    BatchRefused,
    DeadlineMissed,
    WireError,
    deadline_missed_headers,
    error_headers,
)
from faas_gpu.contract.lease import LeaseError, verify
from faas_gpu.contract.slo import parse_budget_ms
from faas_gpu.contract.wire import TENSOR_TYPE, check
from faas_gpu.models.batch_limits import check_batch
from faas_gpu.mps import MPSError
from faas_gpu.serving import bearer_token, request_json, require_bearer_token

from . import mig
from .manager import (
    DeviceMemoryBusy,
    GPUManager,
    ModelDoesNotFit,
    NotResident,
    UnitDraining,
    UnknownModel,
    UnknownUnit,
)
from .worker import LoadLost, ModelInputError, ModelLoadError, OutOfDeviceMemory, WorkerDied


def _text(message: str, status: int) -> Response:
    return Response(message + "\n", status=status, mimetype="text/plain")


def _unavailable(message: str, status: int, state: str) -> Response:
    """The unit cannot take jobs (draining for a reconfiguration, or gone): the scheduler drops it
    from its view at once and places the job elsewhere, rather than retrying the same unit."""
    resp = _text(message, status)
    resp.headers[h.UNIT_STATE] = state
    return resp


def create_app(manager: GPUManager, token: str, max_job_bytes: int = 256 * 1024 * 1024) -> Flask:
    app = Flask("faas-gpu-manager")

    require_bearer_token(app, token, checked_by_route=lambda: request.endpoint == "job" and h.LEASE in request.headers)
    manager.metrics.serve(app, token)  # GET /metrics: Prometheus's text, with the cluster token
    jobs_by_function: Counter[str] = Counter()
    counting = threading.Lock()

    @app.get("/healthz")
    def healthz():
        return _text("OK", 200)

    @app.get("/v1/units")
    def units():
        return jsonify(manager.status())

    @app.put("/v1/models")
    def upload():
        try:
            artifact = manager.store.put(request.stream, request.headers.get(h.MODEL_DIGEST))
        except ArtifactTooLarge as exc:
            return _text(str(exc), 413)
        except ArtifactError as exc:
            return _text(str(exc), 400)
        try:  # read and checked ahead in host memory, so its first miss pays only the copy and warm-up
            manager.uploaded(artifact)
        except Exception as exc:  # the upload stands: its first miss then loads from the store
            app.logger.warning("preparing %s failed: %s", artifact.digest[:12], exc)
        return jsonify(
            {
                "digest": artifact.digest,
                "size": artifact.size,
                "format": artifact.format,
                "batch": artifact.batch.to_json(),
            }
        ), 201

    @app.post("/v1/jobs/<digest>")
    def job(digest: str):
        if not tracing.enabled():
            return run_job(digest)
        attributes = {"faas_gpu.model.digest": digest[:12], "faas_gpu.unit": request.args.get("unit", "")}
        with tracing.server_span("gpu_manager.job", request.headers, attributes) as sp:
            resp = run_job(digest)
            cache = resp.headers.get(h.CACHE)
            tracing.set_attributes(sp, **{"http.status_code": resp.status_code, "faas_gpu.cache": cache})
            return resp

    def check_batch_of(digest: str, shape: list[int]) -> None:
        """BatchRefused for a batch the model would refuse (`batch_limits.check_batch`): the
        model's own 400 would come only after a load, worded by torch. A model not stored here is
        left to `manager.run` (UnknownModel, which the scheduler answers by uploading it)."""
        artifact = manager.store.get(digest)
        if artifact is not None:
            check_batch(artifact.batch, shape, f"model {digest[:12]}…")

    def run_job(digest: str) -> Response:
        unit = request.args.get("unit")
        if not unit:
            return _text("unit: query parameter is required", 400)
        leased = request.headers.get(h.LEASE)
        function = (request.headers.get(h.FUNCTION) or "").strip()[:200]
        if leased is not None:  # a function's instance, with the lease the scheduler gave it
            try:
                lease = verify(
                    token,
                    leased,
                    digest=digest,
                    unit=unit,
                    bearer=bearer_token(request.headers.get("Authorization")),
                    now=time.time(),
                )
            except LeaseError as exc:
                resp = _text(str(exc), exc.status)
                resp.headers.update(error_headers(exc))
                return resp
            function = lease.function
        if request.content_length and request.content_length > max_job_bytes:
            return _text(f"body: larger than {max_job_bytes} bytes", 413)
        try:  # the budget left of a strict batch sent here directly: a deadline on this machine's clock
            budget_ms = parse_budget_ms(request.headers.get(h.BUDGET_MS))
        except ValueError as exc:
            return _text(str(exc), 400)
        deadline = None if budget_ms is None else time.monotonic() + budget_ms / 1000
        payload = request.get_data(cache=False)
        try:
            _, shape, _ = check(payload)  # a malformed batch is the caller's error, not the model's (read, not copied)
            check_batch_of(digest, shape)
            result = manager.run(digest, unit, payload, resident_only=leased is not None, deadline=deadline)
        except DeadlineMissed as exc:  # as the scheduler answers a late job: a miss, not run
            resp = _text(str(exc), exc.status)
            resp.headers.update(deadline_missed_headers(exc))
            return resp
        except BatchRefused as exc:  # before the generic 400s: its code says the caller sent a batch the model refuses
            resp = _text(str(exc), exc.status)
            resp.headers.update(error_headers(exc))
            return resp
        except (WireError, ArtifactError) as exc:
            return _text(str(exc), 400)
        except ModelInputError as exc:
            return _text(f"model: {exc}", 400)
        except UnknownUnit as exc:
            return _unavailable(str(exc), 404, "unknown")
        except UnknownModel as exc:  # the code, not the text, tells the scheduler to upload it
            resp = _text(str(exc), exc.status)
            resp.headers.update(error_headers(exc))
            return resp
        except NotResident as exc:  # a lease never loads a model: the instance goes to the scheduler
            return _text(str(exc), 409)
        except ModelDoesNotFit as exc:  # also a batch out of memory with its model alone on the unit
            return _text(str(exc), 507)
        except (DeviceMemoryBusy, OutOfDeviceMemory) as exc:  # memory held elsewhere: the scheduler places it again
            return _text(str(exc), 503)
        except LoadLost as exc:  # the worker died or hung while loading: not the artifact's fault
            return _text(f"unit {unit}: {exc}", 503)
        except ModelLoadError as exc:
            return _text(str(exc), 400)
        except WorkerDied as exc:
            return _text(f"unit {unit}: {exc}", 503)
        except UnitDraining as exc:
            return _unavailable(str(exc), 503, "draining")
        except MPSError as exc:
            return _text(str(exc), 503)
        if function:
            with counting:
                jobs_by_function[function] += 1
        resp = Response(result.payload, mimetype=TENSOR_TYPE)
        resp.headers.update(
            {
                h.UNIT: result.unit,
                h.CACHE: "hit" if result.hit else "miss",
                h.LOAD_SECONDS: f"{result.load_s:.6f}",
                h.EXECUTE_SECONDS: f"{result.execute_s:.6f}",
                h.MODEL_MB: f"{result.model_mb:.1f}",
            }
        )
        if result.load_split:
            resp.headers[h.LOAD_SPLIT] = ";".join(f"{k}={v:.6f}" for k, v in result.load_split.items())
        return resp

    @app.get("/v1/functions")
    def functions():
        with counting:
            return jsonify(dict(jobs_by_function))

    @app.get("/v1/gpus")
    def gpus():
        return jsonify(manager.gpus())

    @app.post("/v1/gpus/<int:index>/geometry")
    def geometry(index: int):
        try:
            body = request_json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("profiles"), list):
            return _text('body: a JSON object {"profiles": ["3g.20gb", ...]} is required', 400)
        profiles = body["profiles"]
        if not all(isinstance(p, str) for p in profiles):
            return _text("profiles: a list of MIG profile names", 400)
        drain_timeout_s = body.get("drain_timeout_s", 30)
        if isinstance(drain_timeout_s, bool) or not isinstance(drain_timeout_s, int | float) or drain_timeout_s < 0:
            return _text("drain_timeout_s: a number of seconds >= 0", 400)
        try:
            result = manager.reconfigure(index, profiles, float(drain_timeout_s))
        except mig.InvalidGeometry as exc:
            return jsonify(exc.to_json()), 400
        except mig.UnknownGPU as exc:
            return _text(str(exc), 404)
        except mig.MigNotPermitted as exc:  # nothing drained (or NVML refused: it will not be again)
            return _text(str(exc), 403)
        except mig.InstancesInUse as exc:  # put back as it was; worth a try later, not at once
            resp = _text(str(exc), 409)
            resp.headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
            return resp
        except (mig.MigModeOff, mig.UnitsBusy) as exc:
            return _text(str(exc), 409)
        except mig.MigError as exc:
            return _text(str(exc), 500)
        return jsonify(result)

    return app
