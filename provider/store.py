"""Where the provider keeps functions (the datastore) and secrets (0600 files)."""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from pathlib import Path

from faas_gpu.contract import keys
from faas_gpu.datastore import Datastore, SealedDatastore

from .types import FunctionRecord, ValidationError
from .validation import validate_secret_name

log = logging.getLogger(__name__)

PREFIX = keys.FUNCTIONS


class FunctionStore:
    """Function records keyed by namespace and name; the datastore is the source of truth.

    Every record read or written is also kept in memory (`cached`), so the invocation path can go
    on from what it last knew while the datastore is unavailable; the control plane never reads
    the cache (it answers 503 then: a stale deploy or list would be wrong, a stale route is not).

    A stored record is used only when it is sealed by this cluster (the datastore the provider
    opens checks every record's MAC: `faas_gpu.datastore.sealed`) and passes today's deploy
    validation. Any other is quarantined: never started or served (it reads as absent), logged
    once, left in the store, and named by `quarantined` (describe's 404 says why)."""

    def __init__(self, datastore: Datastore):
        self.ds = datastore
        self._lock = threading.Lock()
        self.invalid: dict[str, str] = {}
        """Stored records that fail today's validation (key -> why): skipped, logged once, never raised."""
        self._cache: dict[tuple[str, str], FunctionRecord] = {}

    @staticmethod
    def _key(namespace: str, name: str) -> str:
        return f"{PREFIX}{namespace}/{name}"

    def _load(self, key: str, value: str | bytes) -> FunctionRecord | None:
        """A stored record, validated as a deploy is: one written by an older, laxer provider (a
        300-character name, a 3 MB envProcess) must not stop the others from loading or starting."""
        try:
            record = FunctionRecord.from_json(json.loads(value))
        except (ValidationError, ValueError, KeyError, TypeError, RecursionError) as exc:
            why = str(exc) or type(exc).__name__
            if self.invalid.get(key) != why:
                log.error("skipping the stored function %s: %s (delete it and deploy it again)", key[:200], why)
            self.invalid[key] = why
            return None
        self.invalid.pop(key, None)
        return record

    def quarantined(self, namespace: str | None = None) -> dict[str, str]:
        """Stored records of `namespace` (None: all) that are not acted upon: key -> why, as found by
        the latest read of each (a list, or a get of that function)."""
        prefix = PREFIX + (f"{namespace}/" if namespace else "")
        out = {}
        if isinstance(self.ds, SealedDatastore):
            for q in self.ds.quarantined(prefix):
                out[q.key] = f"its MAC fails ({q.reason}): it was not written by this cluster's provider"
        out.update(
            {k: f"it fails today's deploy validation: {why}" for k, why in self.invalid.items() if k.startswith(prefix)}
        )
        return out

    def quarantine_reason(self, namespace: str, name: str) -> str | None:
        return self.quarantined(namespace).get(self._key(namespace, name))

    def get(self, namespace: str, name: str) -> FunctionRecord | None:
        key = self._key(namespace, name)
        kv = self.ds.get(key)
        if kv is None:
            self.invalid.pop(key, None)
        record = self._load(key, kv.value) if kv else None
        self._remember((namespace, name), record)
        return record

    def cached(self, namespace: str, name: str) -> FunctionRecord | None:
        """The record as last read or written here (None: never seen, or deleted)."""
        return self._cache.get((namespace, name))

    def _remember(self, key: tuple[str, str], record: FunctionRecord | None) -> None:
        if record is None:
            self._cache.pop(key, None)
        else:
            self._cache[key] = record

    def put(self, record: FunctionRecord) -> None:
        self.ds.put(self._key(record.namespace, record.name), json.dumps(record.to_json()))
        self._remember(record.key, record)

    def delete(self, namespace: str, name: str) -> bool:
        deleted = self.ds.delete(self._key(namespace, name))
        self._remember((namespace, name), None)
        return deleted

    def list(self, namespace: str | None = None) -> list[FunctionRecord]:
        prefix = PREFIX + (f"{namespace}/" if namespace else "")
        stored = self.ds.get_prefix(prefix)
        present = {kv.key for kv in stored}
        for key in [k for k in self.invalid if k.startswith(prefix) and k not in present]:
            self.invalid.pop(key, None)
        loaded = (self._load(kv.key, kv.value) for kv in stored)
        records = [r for r in loaded if r is not None]
        listed = {r.key for r in records}
        for key in [k for k in self._cache if (namespace is None or k[0] == namespace) and k not in listed]:
            self._cache.pop(key, None)
        for r in records:
            self._cache[r.key] = r
        return records

    def set_replicas(self, namespace: str, name: str, replicas: int) -> FunctionRecord | None:
        with self._lock:
            record = self.get(namespace, name)
            if record is None:
                return None
            record.replicas = replicas
            self.put(record)
            return record


class SecretStore:
    """One file per secret, mode 0600, under <home>/function-secrets/<namespace>/ (faasd's layout)."""

    def __init__(self, root: Path):
        self.root = root

    def _dir(self, namespace: str) -> Path:
        path = self.root / namespace
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    @staticmethod
    def parse(body: object) -> tuple[str, bytes | None, str | None]:
        """(name, value or None, namespace) from a Secret JSON body."""
        if not isinstance(body, dict):
            raise ValidationError("body: must be a Secret JSON object")
        name = validate_secret_name(body.get("name"), "name")
        namespace = body.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise ValidationError("namespace: must be a string")
        value: bytes | None = None
        if body.get("rawValue") is not None:
            try:
                value = base64.b64decode(body["rawValue"], validate=True)
            except (ValueError, TypeError):
                raise ValidationError("rawValue: must be base64") from None
        elif body.get("value") is not None:
            if not isinstance(body["value"], str):
                raise ValidationError("value: must be a string")
            value = body["value"].encode()
        return name, value, namespace or None

    def exists(self, namespace: str, name: str) -> bool:
        return (self._dir(namespace) / name).is_file()

    def write(self, namespace: str, name: str, value: bytes) -> None:
        path = self._dir(namespace) / name
        tmp = path.with_name(f".{name}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(value)
            os.replace(tmp, path)
        except OSError:  # a full disk: the old value stays whole, and the part written is given back
            tmp.unlink(missing_ok=True)
            raise

    def delete(self, namespace: str, name: str) -> bool:
        try:
            (self._dir(namespace) / name).unlink()
            return True
        except FileNotFoundError:
            return False

    def list(self, namespace: str) -> list[str]:
        return sorted(p.name for p in self._dir(namespace).iterdir() if not p.name.startswith("."))

    def path(self, namespace: str, name: str) -> Path:
        return self._dir(namespace) / name
