"""Turn etcd's authentication on, with the daemons' user and role: one place for what they may do.

Why here: an etcd without authentication is a back door (anyone who reaches its port, or can make a
daemon send a request there, writes what the daemons then act upon). etcd's own answer is users and
roles; this sets up what faas-gpu needs, the same way wherever etcd is started: the test fixtures
(`tests/servers.py`) and the deploy files (`faas-gpu datastore enable-auth`, run once after etcd
starts). etcd's images have no shell, so it is done over etcd's gRPC API, not with etcdctl.

- `root`: etcd's administrator, which `auth enable` requires; its password stays with the operator.
- `faas-gpu` (the daemons' login, `secrets/etcd-credentials`): role `faas-gpu`, read and write under
  `/faas-gpu/` only.
"""

from __future__ import annotations

import grpc
import pyetcd
from pyetcd import etcdrpc

from faas_gpu.contract import keys
from faas_gpu.credentials import Login

from .etcd import Tls, endpoints

ROOT_USER = "root"
DAEMON_ROLE = "faas-gpu"


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range end of a prefix (`etcdctl --prefix`): the prefix with its last byte + 1."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _ignore_exists(call, *args) -> None:
    try:
        call(*args)
    except grpc.RpcError as exc:
        if "already exists" not in (exc.details() or ""):
            raise


def enable_auth(
    url: str,
    root_password: str,
    daemons: Login,
    *,
    prefix: str = keys.ROOT,
    timeout_s: float = 10,
    tls: Tls | None = None,
) -> bool:
    """Users `root` and the daemons', the daemons' role (read/write under `prefix`), then auth on.
    True when it turned auth on; False when etcd already had it on (nothing is changed then: the
    operator manages users from there). Safe to run again after a run that stopped half-way."""
    if not root_password or not daemons.user or not daemons.password:
        raise ValueError("etcd auth: the root password and the daemons' user and password are required")
    if daemons.user == ROOT_USER:
        raise ValueError("etcd auth: the daemons' user must not be root (root may do anything)")
    client = pyetcd.MultiEndpointEtcd3Client(endpoints=endpoints(url, tls)[:1], timeout=timeout_s)
    try:
        auth = client.authstub
        try:
            auth.UserList(etcdrpc.AuthUserListRequest(), timeout_s)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
                return False  # "user name is empty": authentication is on already
            raise
        _ignore_exists(auth.UserAdd, etcdrpc.AuthUserAddRequest(name=ROOT_USER, password=root_password), timeout_s)
        auth.UserChangePassword(
            etcdrpc.AuthUserChangePasswordRequest(name=ROOT_USER, password=root_password), timeout_s
        )
        _ignore_exists(auth.UserGrantRole, etcdrpc.AuthUserGrantRoleRequest(user=ROOT_USER, role="root"), timeout_s)
        _ignore_exists(auth.RoleAdd, etcdrpc.AuthRoleAddRequest(name=DAEMON_ROLE), timeout_s)
        key = prefix.encode()
        permission = etcdrpc.Permission(permType=etcdrpc.Permission.READWRITE, key=key, range_end=_prefix_end(key))
        auth.RoleGrantPermission(etcdrpc.AuthRoleGrantPermissionRequest(name=DAEMON_ROLE, perm=permission), timeout_s)
        _ignore_exists(
            auth.UserAdd, etcdrpc.AuthUserAddRequest(name=daemons.user, password=daemons.password), timeout_s
        )
        auth.UserChangePassword(
            etcdrpc.AuthUserChangePasswordRequest(name=daemons.user, password=daemons.password), timeout_s
        )
        _ignore_exists(
            auth.UserGrantRole, etcdrpc.AuthUserGrantRoleRequest(user=daemons.user, role=DAEMON_ROLE), timeout_s
        )
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout_s)
        return True
    finally:
        client.close()
