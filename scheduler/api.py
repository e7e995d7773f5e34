"""The scheduler's HTTP API for the functions' GPU clients (token-protected).

Each function's replicas hold their own token, not the cluster's (`scheduler.credentials` says
what each may do); uploads are `torch.export` programs or TorchScript, never pickles.

`POST /v1/jobs/<digest>` takes `X-Faas-Gpu-Class`, `X-Faas-Gpu-Deadline-Ms` (the caller's
*remaining* budget in milliseconds: a client that retries sends what is left, and 0 or less
is a miss at once) and `X-Faas-Gpu-Model`: the model's name in PROTEAN's assumptions file (`resnet50`, ...), which the
GPU Reconfigurator uses for a best-effort job's memory; any other name is only a label.
`X-Faas-Gpu-App` (HarmonyBatch's application), when the caller sends one, labels the job's SLO count.

A batch its model does not accept (its first dimension outside the batch its archive declares)
is answered 400, code `batch-refused`, naming `shape[0]` and the batch the model accepts, before
it is queued: as a GPU Manager answers one sent to it under a lease.

`POST /v1/leases/<digest>` (with `X-Faas-Gpu-Class`, and a JSON body {"ran": [[rows, status,
execute s, had an SLO, app], ...]} of the batches run on the previous lease, which the metrics count
as the jobs run through here): a placement lease for the caller's batches of
the model (`faas_gpu.contract.lease`, granted by `scheduler.leases`): 200 {"url", "unit", "lease",
"expires_in_s"}, the GPU Manager and unit to send them to with the lease and the caller's own
token; 204 when no lease is granted now (send the batches here).

`GET /metrics`: Prometheus's text format (`faas_gpu.contract.metrics`), with the cluster token, as
`/v1/status`: the labels name every function and model, which one function's token must not read.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Any

from flask import Flask, Response, jsonify, request

from faas_gpu import tracing
from faas_gpu.contract import headers as h
from faas_gpu.contract import lease as leases
from faas_gpu.contract import metrics as m
from faas_gpu.contract.errors import (
    ArtifactError,
    ArtifactTooLarge,
    BatchRefused,
    ContractError,
    WireError,
    error_headers,
)
from faas_gpu.contract.slo import RequestClass, parse_budget_ms, parse_class
from faas_gpu.contract.wire import TENSOR_TYPE as TENSOR
from faas_gpu.contract.wire import decode
from faas_gpu.datastore import DatastoreUnavailable
from faas_gpu.fn_credentials import CredentialResolver
from faas_gpu.models.batch_limits import check_batch
from faas_gpu.policies import PlacementError
from faas_gpu.serving import bearer_token, request_json

from . import credentials
from .core import Scheduler
from .leader import LeaderElection
from .metrics import app_label
from .sources import ModelSources, valid_source

CALLER_CHECK_S = 0.1  # how often a waiting job route looks whether its caller has hung up


def caller_gone(sock: socket.socket | None) -> bool:
    """The client closed its connection (timed out, or its instance died): EOF on the socket.
    The request body has been read, so anything readable is either EOF or a next request."""
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


def _text(message: str, status: int) -> Response:
    return Response(message + "\n", status=status, mimetype="text/plain")


def _queues(resident: list[tuple[str | None, bool, str | None]]) -> dict[str, Any]:
    """The jobs waiting in the global queues by class, and those held by each unit (running or in
    its local queue): what the operator's status page shows beside each unit."""
    out: dict[str, Any] = {RequestClass.STRICT.value: 0, RequestClass.BEST_EFFORT.value: 0, "units": {}}
    for unit, best_effort, _model in resident:
        if unit is None:
            out[(RequestClass.BEST_EFFORT if best_effort else RequestClass.STRICT).value] += 1
        else:
            out["units"][unit] = out["units"].get(unit, 0) + 1
    return out


def create_app(
    scheduler: Scheduler, election: LeaderElection, token: str, job_timeout_s: float = 300, reconfig: Any = None
) -> Flask:
    """`reconfig`: the GPU Reconfigurator (`scheduler.reconfigure.ReconfigController`), shown in /v1/status."""
    app = Flask("faas-gpu-scheduler")

    resolver = CredentialResolver(scheduler.ds, token)
    sources = ModelSources()
    credentials.install_guard(app, resolver)
    scheduler.metrics.metrics.add_reader(
        lambda: {m.SCHEDULER_LEADER: [((), 1.0 if election.is_leader.is_set() else 0.0)]}
    )
    scheduler.metrics.metrics.serve(app, token)  # GET /metrics: the cluster token, as /v1/status

    @app.errorhandler(DatastoreUnavailable)
    def datastore_unavailable(exc: DatastoreUnavailable):
        resp = _text(f"{exc}; retry later", 503)
        resp.headers["Retry-After"] = "1"
        return resp

    @app.get("/healthz")
    def healthz():
        return _text("OK", 200)

    @app.get("/v1/status")
    def status():
        try:
            leader_id, datastore = election.leader(), "ok"
        except DatastoreUnavailable as exc:  # the status still answers: it is how an operator sees this
            leader_id, datastore = None, str(exc)
        return jsonify(
            {
                "leader": election.is_leader.is_set(),
                "leader_id": leader_id,
                "datastore": datastore,
                "queued": scheduler.queued(),
                "queues": _queues(scheduler.resident_jobs()),
                "deadline_misses": scheduler.deadline_misses,
                "late_dropped": scheduler.late_dropped,
                "abandoned_dropped": scheduler.abandoned_dropped,
                "abandoned_running": scheduler.abandoned_running,
                "units": [u.key for u in scheduler._units],
                "distribution": "protean" if scheduler.distributor is not None else "off",
                "policy": scheduler.view.policy_name,  # placement, as `--policy` chose it
                "o3_limit": scheduler.view.o3_limit if scheduler.view.policy_name == "lalb_o3" else 0,
                **scheduler.model_states.status(),  # "uploading", "models": each model's cold start
                **({"reconfigurator": reconfig.status()} if reconfig is not None else {}),
            }
        )

    @app.put("/v1/models")
    def upload():
        body = scheduler.model_states.receiving(request.stream, credentials.caller().label, request.content_length)
        try:
            a = scheduler.store.put(body, request.headers.get(h.MODEL_DIGEST))
        except ArtifactTooLarge as exc:
            return _text(str(exc), 413)
        except ArtifactError as exc:
            return _text(str(exc), 400)
        finally:
            body.close()  # no longer in flight, whatever the outcome
        refused = credentials.record_upload(resolver, a.digest, a.batch)
        if refused is not None:
            return refused
        scheduler.model_states.uploaded(body, a.digest, a.size)
        source = valid_source(request.headers.get(h.MODEL_SOURCE))
        if source is not None:  # a later replica of this function may skip its export (`scheduler.sources`)
            sources.uploaded(credentials.caller().label, source, a.digest)
        return jsonify({"digest": a.digest, "size": a.size, "format": a.format, "batch": a.batch.to_json()}), 201

    @app.get("/v1/model-sources/<source>")
    def model_source(source: str):
        """The digest this function uploaded for `source`, if it still owns it: its replica then
        neither exports nor uploads the model again (404: it does both, as before)."""
        if valid_source(source) is None:
            return _text("source: must be 64 lower-case hex digits (a SHA-256)", 400)
        who = credentials.caller()
        digest = sources.digest(who.label, source)
        owned = digest is not None and credentials.check_owner(resolver, digest) is None
        artifact = scheduler.store.get(digest) if owned else None
        if artifact is None:
            return _text(f"source: {source[:12]}… has no artifact uploaded by {who.label}", 404)
        return jsonify({"digest": digest, "batch": artifact.batch.to_json()})

    def leader_and_owner(digest: str) -> Response | None:
        """Why this scheduler will not place the caller's batches of `digest`: not the leader
        (503, retry: the client tries the next scheduler), or a model the caller did not upload."""
        if not election.is_leader.is_set():
            resp = _text("not the scheduler leader; retry", 503)
            resp.headers["Retry-After"] = "1"
            return resp
        return credentials.check_owner(resolver, digest)

    @app.post("/v1/leases/<digest>")
    def lease(digest: str):
        refused = leader_and_owner(digest)
        if refused is not None:
            return refused
        who = credentials.caller()
        try:
            body = request_json()
            if isinstance(body, dict) and body.get("ran"):  # the batches it ran on its last lease
                model = (request.headers.get(h.MODEL) or "").strip()[:100] or None
                scheduler.leased_ran(digest, model, None if who.cluster else who.label, body["ran"])
            klass = parse_class(request.headers.get(h.CLASS))
            unit = scheduler.lease(digest, best_effort=klass is RequestClass.BEST_EFFORT)
        except PlacementError as exc:
            return _text(str(exc), 507)
        except (WireError, ValueError) as exc:
            return _text(str(exc), 400)
        except LookupError as exc:
            resp = _text(str(exc), 404)
            if isinstance(exc, ContractError):
                resp.headers.update(error_headers(exc))
            return resp
        if unit is None:
            return Response(status=204)
        granted = leases.Lease(
            digest,
            unit.unit,
            "" if who.cluster else who.label,
            leases.token_sha256(bearer_token(request.headers.get("Authorization")) or ""),
            time.time() + leases.LEASE_S,  # Unix time: the manager that checks it has its own clock
        )
        return jsonify(
            {
                "url": unit.url,
                "unit": unit.unit,
                "lease": leases.sign(scheduler.token, granted),
                "expires_in_s": leases.LEASE_S,
            }
        )

    @app.post("/v1/jobs/<digest>")
    def job(digest: str):
        if not tracing.enabled():
            return run_job(digest)
        with tracing.server_span("scheduler.job", request.headers, {"faas_gpu.model.digest": digest[:12]}) as sp:
            resp = run_job(digest)
            tracing.set_attributes(sp, **{"http.status_code": resp.status_code})
            return resp

    def run_job(digest: str) -> Response:
        refused = leader_and_owner(digest)
        if refused is not None:
            return refused
        payload = request.get_data(cache=False)
        try:
            x = decode(payload)
            artifact = scheduler.store.get(digest)  # None: never uploaded, which submit answers (404)
            if artifact is not None:  # a batch its model would refuse is not placed, loaded and run first
                check_batch(artifact.batch, list(x.shape), f"model {digest[:12]}…")
            budget_ms = parse_budget_ms(request.headers.get(h.BUDGET_MS))  # Scheduler.submit makes it a deadline
            klass = parse_class(request.headers.get(h.CLASS))
            model = (request.headers.get(h.MODEL) or "").strip()[:100] or None
            job = scheduler.submit(
                digest,
                payload,
                None if budget_ms is None else budget_ms / 1000,
                best_effort=klass is RequestClass.BEST_EFFORT,
                model=model,
                function=None if credentials.caller().cluster else credentials.caller().label,
                rows=int(x.shape[0]) if x.dim() else 1,
                app=app_label(request.headers.get(h.APP)),
                trace=tracing.current(),
            )
        except PlacementError as exc:  # a model bigger than every unit (before ValueError: a subclass)
            return _text(str(exc), 507)
        except BatchRefused as exc:  # as the GPU Manager answers it, code and all
            resp = _text(str(exc), exc.status)
            resp.headers.update(error_headers(exc))
            return resp
        except (WireError, ValueError) as exc:
            return _text(str(exc), 400)
        except LookupError as exc:
            resp = _text(str(exc), 404)
            if isinstance(exc, ContractError):  # a model not uploaded: its code, for programs
                resp.headers.update(error_headers(exc))
            return resp
        sock = request.environ.get("gunicorn.socket")
        give_up = scheduler.clock() + job_timeout_s  # the scheduler's clock, like every time it reads
        while not job.done.wait(CALLER_CHECK_S):
            if caller_gone(sock):  # nobody will read the answer: do not start it
                scheduler.abandon(job)
                return _text(f"job {job.id}: the caller has gone", 499)
            if scheduler.clock() > give_up:
                scheduler.abandon(job)
                return _text(f"job {job.id}: no unit finished it within {job_timeout_s:.0f}s", 504)
        out = job.outcome
        resp = Response(out.body, status=out.status, mimetype=TENSOR if out.status == 200 else "text/plain")
        resp.headers.update(out.headers)
        return resp

    return app
