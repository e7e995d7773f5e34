"""`faas-gpu datastore`: the operator's side of the datastore's two walls.

Here, in the provider, as `faas-gpu serve` is (the CLI dispatches both by name): it reads function
records with the provider's own deploy validation.

- `check`: every record under /faas-gpu/ the daemons will not act upon, and why: no MAC (written
  before records were sealed, or by hand), a MAC that fails (not written by this cluster's daemons,
  or changed since), or a function record today's deploy would refuse. The daemons quarantine
  these (logged once each); this lists them all, with `--delete` to remove them. Exit 1 when any.
- `adopt`: the one-time migration from a version that wrote records without a MAC. It seals the
  records that have none (never one whose MAC fails), and a function record only when it passes
  today's deploy validation; it is the operator saying "what this store holds now is ours", so it
  only lists them unless `--yes`.
- `enable-auth`: etcd's authentication on (`faas_gpu.datastore.etcd_auth`), with the daemons'
  login (`secrets/etcd-credentials`, made when missing) and etcd's root password
  (`secrets/etcd-root-credentials`, made when missing); with `--redis-acl FILE`, the ACL file Redis
  starts with, for the daemons' Redis login (`secrets/redis-credentials`). What the deploy files run
  once before the daemons start.

The store is the one the stack in this state folder uses: `--etcd`, else the running stack's
(`stack.json`), else $FAAS_GPU_ETCD, else the embedded store; the cluster token is the state
folder's (`secrets/gpu-manager-token`), which a MAC is checked with.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from faas_gpu import paths
from faas_gpu.contract import env as env_vars
from faas_gpu.contract import keys, records
from faas_gpu.credentials import (
    ETCD_CREDENTIALS_FILE,
    REDIS_CREDENTIALS_FILE,
    TOKEN_FILE,
    Login,
    new_login,
    read_login,
    redis_acl,
    write_login,
)
from faas_gpu.datastore import Datastore, DatastoreUnavailable, open_datastore
from faas_gpu.supervise import STACK_FILE

from .types import FunctionRecord, ValidationError


class CliError(Exception):
    """A message for the operator, printed as `faas-gpu datastore: ...` with exit status 1."""


ROOT_CREDENTIALS_FILE = "etcd-root-credentials"
"""etcd's root login (root:password) under secrets/ when `enable-auth` made it: the operator's, for
etcdctl; no daemon reads it."""


def _stack_etcd(home: Path) -> str | None:
    """The --etcd the running stack's gateway was started with (`faas-gpu up` writes stack.json)."""
    try:
        daemons = json.loads((home / STACK_FILE).read_text())
    except (OSError, ValueError):
        return None
    for d in daemons:
        args = list(d.get("args") or [])
        for i, arg in enumerate(args):
            if arg == "--etcd" and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith("--etcd="):
                return arg.split("=", 1)[1]
    return None


def _open(args: argparse.Namespace, home: Path) -> Datastore:
    url = args.etcd or _stack_etcd(home) or env_vars.ETCD.read()
    try:
        return open_datastore(
            url, paths.state_db(home), credentials_file=args.etcd_credentials, secrets_dir=paths.secrets_dir(home)
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _record_key(home: Path) -> bytes:
    path = paths.secrets_dir(home) / TOKEN_FILE
    try:
        return records.record_key(path.read_text().strip())
    except (OSError, ValueError):
        raise CliError(f"no cluster token at {path}: run this in the stack's state folder (FAAS_GPU_HOME)") from None


def _function_problem(value: bytes) -> str | None:
    """Why today's deploy would refuse this function record (None: it would not)."""
    try:
        FunctionRecord.from_json(json.loads(value))
    except (ValidationError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return f"fails today's deploy validation: {str(exc) or type(exc).__name__}"
    return None


def _problems(ds: Datastore, key: bytes) -> list[tuple[str, str, bool]]:
    """(key, why, unsigned and otherwise valid) for every record the daemons will not act upon."""
    out = []
    for kv in ds.get_prefix(keys.ROOT):
        try:
            value = records.unseal(key, kv.key, kv.value)
        except records.RecordError as exc:
            why = (
                "no MAC (written before records were sealed, or by hand)"
                if exc.reason == records.UNSIGNED
                else "its MAC fails (not written by this cluster's daemons, or changed since)"
            )
            invalid = _function_problem(kv.value) if kv.key.startswith(keys.FUNCTIONS) else None
            adoptable = exc.reason == records.UNSIGNED and invalid is None
            out.append((kv.key, why + (f"; and it {invalid}" if invalid else ""), adoptable))
            continue
        if kv.key.startswith(keys.FUNCTIONS):
            invalid = _function_problem(value)
            if invalid:
                out.append((kv.key, invalid, False))
    return out


def check(args: argparse.Namespace) -> int:
    home = paths.home()
    key = _record_key(home)
    ds = _open(args, home)
    try:
        found = _problems(ds, key)
        for name, why, _ in found:
            print(f"quarantined  {name}: {why}")
        if args.delete:
            for name, _, _ in found:
                ds.delete(name)
            if found:
                print(f"deleted {len(found)} quarantined record(s)")
    finally:
        ds.close()
    if not found:
        print("every record under /faas-gpu/ is sealed by this cluster and valid")
    return 1 if found and not args.delete else 0


def adopt(args: argparse.Namespace) -> int:
    home = paths.home()
    key = _record_key(home)
    ds = _open(args, home)
    sealed = 0
    try:
        for name, why, adoptable in _problems(ds, key):
            if not adoptable:
                print(f"left quarantined  {name}: {why}")
                continue
            kv = ds.get(name)
            if kv is None:
                continue
            if args.yes:  # only if nobody changed it since it was read
                if ds.compare_and_swap(name, records.seal(key, name, kv.value), expected_mod_revision=kv.mod_revision):
                    sealed += 1
                    print(f"sealed  {name}")
            else:
                print(f"would seal  {name}")
    finally:
        ds.close()
    if not args.yes:
        print("nothing written: run again with --yes once you trust these records (they are then started)")
    else:
        print(f"sealed {sealed} record(s)")
    return 0


def _login_file(given: Path | None, default: Path, user: str) -> Login:
    if given is not None:
        return read_login(given)
    if not default.is_file():
        write_login(default, new_login(user))
    return read_login(default)


def enable_auth(args: argparse.Namespace) -> int:
    from faas_gpu.datastore.etcd import Tls
    from faas_gpu.datastore.etcd_auth import enable_auth as turn_on

    secrets = paths.secrets_dir(paths.home())
    try:
        if args.root_password_file is not None:
            root_password = args.root_password_file.read_text().strip()
        else:
            root_password = _login_file(None, secrets / ROOT_CREDENTIALS_FILE, "root").password
        daemons = _login_file(args.credentials, secrets / ETCD_CREDENTIALS_FILE, "faas-gpu")
        if args.redis_acl is not None:
            redis = _login_file(args.redis_credentials, secrets / REDIS_CREDENTIALS_FILE, "faas-gpu")
            args.redis_acl.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.redis_acl.with_name(args.redis_acl.name + ".tmp")
            tmp.write_text(redis_acl(redis))
            tmp.chmod(0o644)  # read by Redis's own user; the password is in it as a hash only
            tmp.replace(args.redis_acl)
            print(f"redis: ACL for user {redis.user!r} written to {args.redis_acl}")
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    deadline = time.monotonic() + args.wait
    while True:
        try:
            turned_on = turn_on(args.etcd, root_password, daemons, tls=Tls.from_folder(secrets))
            break
        except ValueError as exc:
            raise CliError(str(exc)) from None
        except Exception as exc:  # etcd not up yet: the deploy files start this beside it
            if time.monotonic() > deadline:
                raise CliError(f"etcd at {args.etcd} did not answer within {args.wait:g}s: {exc}") from None
            time.sleep(1)
    if turned_on:
        print(f"etcd: authentication on; the daemons' user {daemons.user!r} may read and write under {keys.ROOT}")
    else:
        print("etcd: authentication was already on (nothing changed)")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="faas-gpu datastore", description=__doc__)
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def store_flags(q: argparse.ArgumentParser) -> None:
        q.add_argument("--etcd", help="etcd URL (default: the running stack's, else $FAAS_GPU_ETCD, else embedded)")
        q.add_argument("--etcd-credentials", type=Path, help="etcd login file (default secrets/etcd-credentials)")

    q = sub.add_parser("check", help="list the records the daemons will not act upon (exit 1 when any)")
    store_flags(q)
    q.add_argument("--delete", action="store_true", help="delete them too")
    q.set_defaults(func=check)
    q = sub.add_parser("adopt", help="seal the records an older version wrote without a MAC (once, after an upgrade)")
    store_flags(q)
    q.add_argument("--yes", action="store_true", help="write (without it: only list what would be sealed)")
    q.set_defaults(func=adopt)
    q = sub.add_parser("enable-auth", help="turn etcd's authentication on with the daemons' user and role")
    q.add_argument("--etcd", required=True, help="etcd URL, e.g. http://127.0.0.1:2379")
    q.add_argument(
        "--root-password-file",
        type=Path,
        help="a file holding etcd's root password (default: secrets/etcd-root-credentials, made when missing)",
    )
    q.add_argument(
        "--credentials", type=Path, help="the daemons' etcd login, user:password (default: secrets/etcd-credentials)"
    )
    q.add_argument("--redis-acl", type=Path, help="also write Redis's ACL file here, for the daemons' Redis login")
    q.add_argument(
        "--redis-credentials", type=Path, help="the daemons' Redis login (default: secrets/redis-credentials)"
    )
    q.add_argument("--wait", type=float, default=60, help="seconds to wait for etcd to answer (default 60)")
    q.set_defaults(func=enable_auth)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, DatastoreUnavailable) as exc:
        print(f"faas-gpu datastore: {exc}", file=sys.stderr)
        return 1
