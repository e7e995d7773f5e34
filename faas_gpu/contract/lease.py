"""Placement leases: the scheduler places a function's batches on a unit for a short while, and
the function's instance sends them to that unit's GPU Manager itself.

Why: a batch that goes instance -> scheduler -> GPU Manager pays two HTTP hops and the
scheduler's CPU for every batch, while placement only has to be decided when something changes.
With a lease the instance asks the scheduler once (`POST /v1/leases/<digest>`) and sends its
batches straight to the manager (`POST /v1/jobs/<digest>?unit=` with `X-Faas-Gpu-Lease`) until
the lease runs out (`LEASE_S`); the scheduler grants one only when placing the batches itself
would decide nothing else (see `scheduler.leases`), and the old path stays for everything else.

A lease is a token the scheduler signs with a key derived from the cluster token (HMAC-SHA256),
which every GPU Manager holds too, so a manager checks it without asking anyone:

    base64url(JSON {"d": digest, "u": unit, "f": "name.namespace", "t": sha256(function token), "e": expiry})
    "." base64url(HMAC)

It names one model, one unit and one function, and runs out at `e` (Unix seconds, the
machines' clocks; `LEASE_S` is short and the manager allows `CLOCK_SKEW_S`). It is not a
credential by itself: the manager also wants the function's own token (`t` is its digest), so
the instance sends both, and a lease read from a log runs nothing. Functions never hold the
cluster token, and the managers never learn a function's token, only its digest.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass

from .errors import ContractError

LEASE_S = 2.0
"""How long a lease the scheduler grants lasts: the longest a placement decision stands unseen."""
RENEW_BEFORE_S = 0.25
"""The instance asks for the next lease this long before its lease runs out."""
CLOCK_SKEW_S = 1.0
"""How far the scheduler's and a manager's clocks may differ."""
_KEY_CONTEXT = b"faas-gpu placement lease v1\x00"


class LeaseError(ContractError, PermissionError):
    """A lease that is malformed, forged, for another model, unit or token, or run out (401):
    the instance drops it and sends the batch through the scheduler."""

    status, code = 401, "lease-refused"


@dataclass(frozen=True)
class Lease:
    digest: str
    unit: str
    function: str  # name.namespace: the manager counts the function's jobs under it
    token_sha256: str  # the function's token's digest: only its holder may use the lease
    expires: float  # Unix seconds


def _key(cluster_token: str) -> bytes:
    return hashlib.sha256(_KEY_CONTEXT + cluster_token.encode()).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def sign(cluster_token: str, lease: Lease) -> str:
    body = json.dumps(
        {"d": lease.digest, "u": lease.unit, "f": lease.function, "t": lease.token_sha256, "e": lease.expires},
        separators=(",", ":"),
    ).encode()
    mac = hmac.new(_key(cluster_token), body, hashlib.sha256).digest()
    return f"{_b64(body)}.{_b64(mac)}"


def verify(cluster_token: str, text: str, *, digest: str, unit: str, bearer: str | None, now: float) -> Lease:
    """The lease `text` if it was signed with the cluster token and is for this digest, unit and
    bearer token, and has not run out at `now` (Unix seconds); LeaseError saying why not."""
    if not cluster_token or not bearer:
        raise LeaseError("lease: the function's token is required with a lease")
    try:
        body_b64, mac_b64 = text.strip().split(".")
        body, mac = _unb64(body_b64), _unb64(mac_b64)
    except (ValueError, TypeError):
        raise LeaseError("lease: malformed") from None
    if not hmac.compare_digest(mac, hmac.new(_key(cluster_token), body, hashlib.sha256).digest()):
        raise LeaseError("lease: not signed by this cluster's scheduler")
    try:
        d = json.loads(body)
        lease = Lease(str(d["d"]), str(d["u"]), str(d["f"]), str(d["t"]), float(d["e"]))
    except (ValueError, KeyError, TypeError):
        raise LeaseError("lease: malformed") from None
    if lease.digest != digest or lease.unit != unit:
        raise LeaseError("lease: granted for another model or unit")
    if not hmac.compare_digest(lease.token_sha256, token_sha256(bearer)):
        raise LeaseError("lease: granted to another function's token")
    if now > lease.expires + CLOCK_SKEW_S:
        raise LeaseError("lease: run out; ask the scheduler for another")
    return lease
