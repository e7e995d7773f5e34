"""What every command shares: the gateway and its credentials, one HTTP client, reading replies,
loading the stack file, and the flags every gateway-talking command takes.

Gateway: `--gateway` > the stack's provider.gateway > $OPENFAAS_URL > http://127.0.0.1:8080.
Credentials: `--username/--password`, else the stack's own files (`.faas-gpu/secrets/basic-auth-user`
and `basic-auth-password`), else faas-cli's saved login (config.yml in $OPENFAAS_CONFIG, ./.openfaas
when CI=true, else ~/.openfaas). `invoke` sends no system credentials, like faas-cli.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
from collections.abc import Iterable
from pathlib import Path

import requests
import yaml

from faas_gpu import paths
from faas_gpu.stack import DEFAULT_GATEWAY, Stack, find_stack_file, load_stack

DEFAULT_NAMESPACE = "openfaas-fn"
TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 10
OK_DEPLOY = (200, 202)  # faas-cli's badStatusCode: 201 counts as a failure


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


# -- gateway and credentials -------------------------------------------------------------
def norm_url(url: str) -> str:
    return url.strip().lower().rstrip("/")


def gateway_url(flag: str | None, stack: Stack | None) -> str:
    """faas-cli's precedence (commands/priority.go): --gateway (if not the default) > stack
    provider.gateway (if not the default) > OPENFAAS_URL > http://127.0.0.1:8080."""
    if flag and norm_url(flag) != DEFAULT_GATEWAY:
        return norm_url(flag)
    if stack is not None and stack.gateway and norm_url(stack.gateway) != DEFAULT_GATEWAY:
        return norm_url(stack.gateway)
    if os.environ.get("OPENFAAS_URL"):
        return norm_url(os.environ["OPENFAAS_URL"])
    return DEFAULT_GATEWAY


def faas_cli_config_file() -> Path:
    if os.environ.get("OPENFAAS_CONFIG"):
        return Path(os.environ["OPENFAAS_CONFIG"]) / "config.yml"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        return Path.cwd() / ".openfaas" / "config.yml"
    return Path.home() / ".openfaas" / "config.yml"


def _faas_cli_token(gateway: str) -> str | None:
    try:
        data = yaml.safe_load(faas_cli_config_file().read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    for entry in data.get("auths") or []:
        if (
            isinstance(entry, dict)
            and norm_url(str(entry.get("gateway", ""))) == gateway
            and entry.get("auth") == "basic"
        ):
            return entry.get("token")
    return None


def credentials(args: argparse.Namespace, gateway: str) -> tuple[str, str] | None:
    if getattr(args, "username", None) or getattr(args, "password", None):
        return (getattr(args, "username", None) or "admin", getattr(args, "password", None) or "")
    secrets = paths.secrets_dir()
    try:
        return (
            (secrets / "basic-auth-user").read_text().strip(),
            (secrets / "basic-auth-password").read_text().strip(),
        )
    except OSError:
        pass
    token = _faas_cli_token(gateway)
    if token:
        try:
            user, _, password = base64.b64decode(token).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return (user, password)
    return None


class Client:
    """HTTP to the gateway with timeouts; connection problems become one clear CliError."""

    def __init__(self, gateway: str, auth: tuple[str, str] | None):
        self.gateway = gateway
        self.auth = auth
        self.session = requests.Session()

    def request(self, method: str, path: str, *, system: bool = True, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, TIMEOUT_S))
        if system and self.auth:
            kwargs.setdefault("auth", self.auth)
        url = self.gateway + path
        try:
            return self.session.request(method, url, **kwargs)
        except requests.ConnectionError as exc:
            raise CliError(
                f"cannot reach gateway at {self.gateway}: {_reason(exc)} (is the stack running? faas-gpu up)"
            ) from None
        except requests.Timeout:
            raise CliError(f"gateway at {self.gateway} did not answer in time ({method} {path})") from None
        except requests.RequestException as exc:
            raise CliError(f"bad gateway URL {self.gateway}: {exc}") from None


def _reason(exc: Exception) -> str:
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^')]+)", text)
    return m.group(1) if m else "connection failed"


# -- replies -----------------------------------------------------------------------------
def message_of(resp: requests.Response) -> str:
    return resp.text.strip()[:2000] or resp.reason or ""


def check(resp: requests.Response, ok: Iterable[int], what: str) -> requests.Response:
    if resp.status_code == 401:
        raise CliError(
            f"{what}: unauthorized (401); give --username/--password or check {paths.secrets_dir()}/basic-auth-*"
        )
    if resp.status_code not in tuple(ok):
        raise CliError(f"{what}: unexpected status {resp.status_code}: {message_of(resp)}")
    return resp


def json_of(resp: requests.Response, what: str):
    try:
        return resp.json()
    except ValueError:
        raise CliError(f"{what}: the gateway answered {resp.status_code} with a body that is not JSON") from None


# -- arguments ---------------------------------------------------------------------------
def stack_of(args: argparse.Namespace, required: bool = True) -> Stack | None:
    path = find_stack_file(getattr(args, "yaml", None))
    if path is None:
        if required:
            raise CliError("no stack file: give -f stack.yml (or create ./stack.yaml)")
        return None
    return load_stack(path, substitute=getattr(args, "envsubst", True))


def client_for(args: argparse.Namespace, stack: Stack | None = None) -> Client:
    gw = gateway_url(getattr(args, "gateway", None), stack)
    return Client(gw, credentials(args, gw))


def key_values(pairs: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{what}: expected key=value, got {pair!r}")
        out[key] = value
    return out


def ns_body(namespace: str | None) -> dict[str, str]:
    return {"namespace": namespace} if namespace else {}


def parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_common_flags(p: argparse.ArgumentParser, stack: bool = True) -> None:
    p.add_argument("-g", "--gateway", help=f"gateway URL (default: stack file, $OPENFAAS_URL, {DEFAULT_GATEWAY})")
    p.add_argument("-u", "--username", help="basic-auth user (default: the stack's credentials files)")
    p.add_argument("-p", "--password", help="basic-auth password")
    if stack:
        p.add_argument("-f", "--yaml", help="stack file (default ./stack.yaml, then ./stack.yml)")
        p.add_argument(
            "--envsubst", type=parse_bool, nargs="?", const=True, default=True, help="substitute ${VAR} (default true)"
        )
        p.add_argument("--no-envsubst", dest="envsubst", action="store_false", help="no ${VAR} substitution")
