"""Datastore records carry a MAC: what a daemon acts upon is what a daemon wrote.

Why: the datastore is input. A record in it starts processes (a function's `envProcess`), routes
jobs and the cluster token (a unit report's manager URL, a scheduler's announced URL), grants
rights (a function token's digest -> its function) and takes nodes out of service (cordons). An
anonymous etcd once took a forged function record through an SSRF, and the provider launched it.
Authentication on etcd and Redis is the first wall; this is the second: every value the daemons
write is sealed with an HMAC-SHA256 under a key derived from the cluster token (which only the
daemons hold, `faas_gpu.credentials`), and every value they read is checked before it is used.

Stored form (readable with `etcdctl get`):

    faas-gpu:mac1:<base64url HMAC, 43 characters>.<the value, unchanged>

The MAC covers the key as well as the value (length-prefixed), so a sealed record moved to
another key (another function's name, another token's digest) fails. It is deterministic, so a
compare-and-swap on an expected value works on sealed values as on plain ones.

What a MAC cannot do: tell an old sealed value from the current one. Someone able to write to the
datastore could put back a value the daemons wrote there before (a removed function's record);
keeping writers out (etcd users, Redis ACLs) is what stops that.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

MAGIC = b"faas-gpu:mac1:"
_MAC_CHARS = 43  # base64url of 32 bytes, unpadded
_SEPARATOR = b"."
_PURPOSE = b"faas-gpu datastore records v1"
"""The KDF's purpose label: the record key is not the lease key (`contract.lease`) nor the token."""

UNSIGNED = "unsigned"
"""A value without a MAC: written by a version before records were sealed, or by hand."""
FORGED = "bad MAC"
"""A MAC that does not match: written without the cluster key, changed since, moved from another
key, or sealed under another cluster's token."""


class RecordError(ValueError):
    """A stored value that is not a sealed record of this cluster; `reason` is `UNSIGNED` or `FORGED`."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key[:200]}: {reason}")
        self.key, self.reason = key, reason


def record_key(cluster_token: str) -> bytes:
    """The records' MAC key: HMAC-SHA256 of a purpose label under the cluster token (a one-step
    KDF, as HKDF's extract), so no other use of the token yields the same key."""
    if not cluster_token:
        raise ValueError("records: the cluster token is empty")
    return hmac.new(cluster_token.encode(), _PURPOSE, hashlib.sha256).digest()


def _mac(key: bytes, name: str, value: bytes) -> bytes:
    encoded = name.encode("utf-8", "surrogateescape")
    message = len(encoded).to_bytes(4, "big") + encoded + value
    return hmac.new(key, message, hashlib.sha256).digest()


def seal(key: bytes, name: str, value: bytes) -> bytes:
    """The stored form of `value` under the datastore key `name`."""
    mac = base64.urlsafe_b64encode(_mac(key, name, value)).rstrip(b"=")
    return MAGIC + mac + _SEPARATOR + value


def unseal(key: bytes, name: str, stored: bytes) -> bytes:
    """The value a sealed record holds; RecordError when it has no MAC or a wrong one."""
    head = len(MAGIC) + _MAC_CHARS
    if not stored.startswith(MAGIC) or len(stored) <= head or stored[head : head + 1] != _SEPARATOR:
        raise RecordError(name, UNSIGNED)
    value = stored[head + 1 :]
    try:
        mac = base64.urlsafe_b64decode(stored[len(MAGIC) : head] + b"=")
    except ValueError:
        raise RecordError(name, FORGED) from None
    if not hmac.compare_digest(mac, _mac(key, name, value)):
        raise RecordError(name, FORGED)
    return value


def is_sealed(stored: bytes) -> bool:
    """Whether a value has the sealed form (a MAC, right or wrong): a migration re-seals only
    records that have none, never one whose MAC fails."""
    head = len(MAGIC) + _MAC_CHARS
    return stored.startswith(MAGIC) and len(stored) > head and stored[head : head + 1] == _SEPARATOR
