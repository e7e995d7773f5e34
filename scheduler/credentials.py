"""Who may call the scheduler's API, and for which models (see `faas_gpu.fn_credentials`).

- the cluster token (daemons, operators' tools): every route;
- a function's own token (its replicas' GPU client): `PUT /v1/models` (the upload is recorded
  as the function's), `GET /v1/model-sources/<source>` (the digest it uploaded for a source),
  and `POST /v1/jobs/<digest>` and `POST /v1/leases/<digest>` for digests it
  uploaded itself (403 otherwise);
  status and any other route are cluster-only (403);
- anything else: 401.
The function's identity travels to the GPU Manager (`faas_gpu.contract.headers.FUNCTION`) for accounting only:
managers accept the cluster token, and a function's token only with a lease the scheduler signed
for that token, model and unit (`faas_gpu.contract.lease`): it runs that model on that unit, briefly.
"""

from __future__ import annotations

from flask import Flask, Response, g, request

from faas_gpu.datastore import DatastoreError
from faas_gpu.fn_credentials import CLUSTER, Caller, CredentialResolver
from faas_gpu.models.batch_limits import BatchLimits
from faas_gpu.serving import bearer_token, unauthorized

FUNCTION_ROUTES = ("upload", "model_source", "job", "lease", "healthz")  # endpoints a function's token may use


def _text(message: str, status: int) -> Response:
    return Response(message + "\n", status=status, mimetype="text/plain")


def install_guard(app: Flask, resolver: CredentialResolver, prefix: str = "/v1/") -> None:
    @app.before_request
    def _check_caller():
        if not request.path.startswith(prefix):
            return None
        try:
            caller = resolver.resolve(bearer_token(request.headers.get("Authorization")))
        except DatastoreError as exc:
            return _text(f"credentials: the datastore is unavailable ({exc}); retry", 503)
        if caller is None:
            return unauthorized()
        if not caller.cluster and request.endpoint not in FUNCTION_ROUTES:
            return _text(f"{request.path}: needs the cluster token, not function {caller.label}'s", 403)
        g.caller = caller
        return None


def caller() -> Caller:
    return g.get("caller", CLUSTER)


def check_owner(resolver: CredentialResolver, digest: str) -> Response | None:
    """403 when a function asks to run a model it has not uploaded itself."""
    who = caller()
    try:
        if resolver.owns(who, digest):
            return None
    except DatastoreError as exc:
        return _text(f"credentials: the datastore is unavailable ({exc}); retry", 503)
    return _text(
        f"model: {digest[:12]}… was not uploaded by function {who.label}; "
        "a function runs only models it uploaded itself (PUT /v1/models with the artifact)",
        403,
    )


def record_upload(resolver: CredentialResolver, digest: str, batch: BatchLimits | None = None) -> Response | None:
    try:
        resolver.record_upload(caller(), digest, batch)
    except DatastoreError as exc:
        return _text(f"credentials: the datastore is unavailable ({exc}); retry", 503)
    return None
