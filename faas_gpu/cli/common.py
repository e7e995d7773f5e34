"""What every command shares: the gateway and its credentials, one HTTP client, reading replies,
loading the stack file, and the flags every gateway-talking command takes.

The stack (state folder: credentials, image store) is found from any folder by
`faas_gpu.running.locate`: $FAAS_GPU_HOME > `.faas-gpu` beside the stack file, then in the current
folder > the running stack `faas-gpu up` recorded in the per-user config.
Gateway: `--gateway` > the stack's provider.gateway > $OPENFAAS_URL > the located stack's recorded
gateway > http://127.0.0.1:8080.
Credentials: `--username/--password`, else the located stack's files (`secrets/basic-auth-user`
and `basic-auth-password`; a recorded stack's only for its own gateway), else faas-cli's saved
login (config.yml in $OPENFAAS_CONFIG, ./.openfaas when CI=true, else ~/.openfaas). `invoke`
sends no system credentials, like faas-cli.
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
from faas_gpu.running import Located, locate
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


def gateway_url(flag: str | None, stack: Stack | None, recorded: str | None = None) -> str:
    """faas-cli's precedence (commands/priority.go): --gateway (if not the default) > stack
    provider.gateway (if not the default) > OPENFAAS_URL > http://127.0.0.1:8080; faas-gpu puts
    the gateway `up` recorded for the located stack (`recorded`) before that last default, as
    faas-cli's login remembers a gateway."""
    if flag and norm_url(flag) != DEFAULT_GATEWAY:
        return norm_url(flag)
    if stack is not None and stack.gateway and norm_url(stack.gateway) != DEFAULT_GATEWAY:
        return norm_url(stack.gateway)
    if os.environ.get("OPENFAAS_URL"):
        return norm_url(os.environ["OPENFAAS_URL"])
    if recorded:
        return norm_url(recorded)
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


_UNSET = Path()


def credentials(args: argparse.Namespace, gateway: str, home: Path | None = _UNSET) -> tuple[str, str] | None:
    """Flags, else the state folder `home`'s files (default: `paths.home()`; None: no state
    folder), else faas-cli's saved login for `gateway`."""
    return _credentials(args, gateway, paths.home() if home is _UNSET else home)[0]


def _credentials(args: argparse.Namespace, gateway: str, home: Path | None) -> tuple[tuple[str, str] | None, str]:
    """The credentials and where they came from (for the message of a 401)."""
    if getattr(args, "username", None) or getattr(args, "password", None):
        user, password = getattr(args, "username", None) or "admin", getattr(args, "password", None) or ""
        return (user, password), "--username/--password"
    if home is not None:
        secrets = paths.secrets_dir(home)
        try:
            return (
                (secrets / "basic-auth-user").read_text().strip(),
                (secrets / "basic-auth-password").read_text().strip(),
            ), f"{secrets}/basic-auth-*"
        except OSError:
            pass
    config = faas_cli_config_file()
    token = _faas_cli_token(gateway)
    if token:
        try:
            user, _, password = base64.b64decode(token).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None, f"faas-cli's login in {config} (unreadable token)"
        return (user, password), f"faas-cli's login in {config}"
    return None, "none"


class Client:
    """HTTP to the gateway with timeouts; connection problems become one clear CliError."""

    def __init__(
        self,
        gateway: str,
        auth: tuple[str, str] | None,
        located: Located | None = None,
        auth_source: str = "",
    ):
        self.gateway = gateway
        self.auth = auth
        self.located = located  # the stack the command found, named in its errors
        self.auth_source = auth_source
        self.session = requests.Session()

    def _stack_hint(self) -> str:
        if self.located is None:
            return "is the stack running? faas-gpu up"
        if self.located.home is None:
            return f"{self.located.describe()}; start one with `faas-gpu up`"
        return f"{self.located.describe()}; is it running? faas-gpu up"

    def request(self, method: str, path: str, *, system: bool = True, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, TIMEOUT_S))
        if system and self.auth:
            kwargs.setdefault("auth", self.auth)
        url = self.gateway + path
        try:
            resp = self.session.request(method, url, **kwargs)
        except requests.ConnectionError as exc:
            raise CliError(f"cannot reach gateway at {self.gateway}: {_reason(exc)} ({self._stack_hint()})") from None
        except requests.Timeout:
            raise CliError(f"gateway at {self.gateway} did not answer in time ({method} {path})") from None
        except requests.RequestException as exc:
            raise CliError(f"bad gateway URL {self.gateway}: {exc}") from None
        resp.faas_gpu_client = self  # type: ignore[attr-defined]  # `check` names our credentials on a 401
        return resp


def _reason(exc: Exception) -> str:
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return m.group(1) if m else "connection failed"


# -- replies -----------------------------------------------------------------------------
def message_of(resp: requests.Response) -> str:
    return resp.text.strip()[:2000] or resp.reason or ""


def check(resp: requests.Response, ok: Iterable[int], what: str) -> requests.Response:
    if resp.status_code == 401:
        raise CliError(f"{what}: unauthorized (401); {unauthorized_hint(resp)}")
    if resp.status_code not in tuple(ok):
        raise CliError(f"{what}: unexpected status {resp.status_code}: {message_of(resp)}")
    return resp


def unauthorized_hint(resp: requests.Response) -> str:
    """Which credentials were sent and which stack they came from, so a 401 says what to fix."""
    client = getattr(resp, "faas_gpu_client", None)
    if client is None:
        return f"give --username/--password or check {paths.secrets_dir()}/basic-auth-*"
    if client.auth is None:
        sent = "no credentials were sent"
    else:
        sent = f"the credentials sent came from {client.auth_source}"
    where = client.located.describe() if client.located is not None else "no faas-gpu stack located"
    return f"{sent} ({where}); give --username/--password, `faas-cli login`, or set FAAS_GPU_HOME"


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


def located_for(stack: Stack | None) -> Located:
    """The stack a command talks to, found from its stack file's folder or the current one."""
    return locate(stack.stack_dir if stack is not None else None)


def client_for(args: argparse.Namespace, stack: Stack | None = None) -> Client:
    located = located_for(stack)
    gw = gateway_url(getattr(args, "gateway", None), stack, located.gateway)
    auth, source = _credentials(args, gw, located.credentials_home(gw))
    return Client(gw, auth, located, source)


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
    p.add_argument(
        "-g",
        "--gateway",
        help=f"gateway URL (default: stack file, $OPENFAAS_URL, the stack `faas-gpu up` recorded, {DEFAULT_GATEWAY})",
    )
    p.add_argument("-u", "--username", help="basic-auth user (default: the located stack's credentials files)")
    p.add_argument("-p", "--password", help="basic-auth password")
    if stack:
        p.add_argument("-f", "--yaml", help="stack file (default ./stack.yaml, then ./stack.yml)")
        p.add_argument(
            "--envsubst", type=parse_bool, nargs="?", const=True, default=True, help="substitute ${VAR} (default true)"
        )
        p.add_argument("--no-envsubst", dest="envsubst", action="store_false", help="no ${VAR} substitution")
