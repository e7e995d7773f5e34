"""`faas-gpu`: the CLI. Reads the same stack file as faas-cli 0.18 and makes the same REST calls.

Gateway: `--gateway` > the stack's provider.gateway > $OPENFAAS_URL > http://127.0.0.1:8080.
Credentials: `--username/--password`, else the stack's own files (`.faas-gpu/secrets/basic-auth-user`
and `basic-auth-password`), else faas-cli's saved login (config.yml in $OPENFAAS_CONFIG, ./.openfaas
when CI=true, else ~/.openfaas). `invoke` sends no system credentials, like faas-cli.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests
import yaml

from faas_gpu import __version__, paths
from faas_gpu.build import build as build_image
from faas_gpu.build import find_template, load_template, shrinkwrap
from faas_gpu.contract.duration import parse_duration
from faas_gpu.imagestore import BuildError
from faas_gpu.stack import (
    DEFAULT_GATEWAY,
    NAME_RE,
    FunctionSpec,
    Stack,
    StackError,
    find_stack_file,
    load_stack,
)

DEFAULT_NAMESPACE = "openfaas-fn"
TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 10
OK_DEPLOY = (200, 202)  # faas-cli's badStatusCode: 201 counts as a failure


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


# -- gateway and credentials -------------------------------------------------------------
def _norm(url: str) -> str:
    return url.strip().lower().rstrip("/")


def gateway_url(flag: str | None, stack: Stack | None) -> str:
    """faas-cli's precedence (commands/priority.go): --gateway (if not the default) > stack
    provider.gateway (if not the default) > OPENFAAS_URL > http://127.0.0.1:8080."""
    if flag and _norm(flag) != DEFAULT_GATEWAY:
        return _norm(flag)
    if stack is not None and stack.gateway and _norm(stack.gateway) != DEFAULT_GATEWAY:
        return _norm(stack.gateway)
    if os.environ.get("OPENFAAS_URL"):
        return _norm(os.environ["OPENFAAS_URL"])
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
        if isinstance(entry, dict) and _norm(str(entry.get("gateway", ""))) == gateway and entry.get("auth") == "basic":
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


def _message(resp: requests.Response) -> str:
    return resp.text.strip()[:2000] or resp.reason or ""


def _check(resp: requests.Response, ok: Iterable[int], what: str) -> requests.Response:
    if resp.status_code == 401:
        raise CliError(
            f"{what}: unauthorized (401); give --username/--password or check {paths.secrets_dir()}/basic-auth-*"
        )
    if resp.status_code not in tuple(ok):
        raise CliError(f"{what}: unexpected status {resp.status_code}: {_message(resp)}")
    return resp


def _json(resp: requests.Response, what: str):
    try:
        return resp.json()
    except ValueError:
        raise CliError(f"{what}: the gateway answered {resp.status_code} with a body that is not JSON") from None


def _load(args: argparse.Namespace, required: bool = True) -> Stack | None:
    path = find_stack_file(getattr(args, "yaml", None))
    if path is None:
        if required:
            raise CliError("no stack file: give -f stack.yml (or create ./stack.yaml)")
        return None
    return load_stack(path, substitute=getattr(args, "envsubst", True))


def _client(args: argparse.Namespace, stack: Stack | None = None) -> Client:
    gw = gateway_url(getattr(args, "gateway", None), stack)
    return Client(gw, credentials(args, gw))


def _kv(pairs: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{what}: expected key=value, got {pair!r}")
        out[key] = value
    return out


def _ns_body(namespace: str | None) -> dict[str, str]:
    return {"namespace": namespace} if namespace else {}


# -- build -------------------------------------------------------------------------------
def cmd_build(args: argparse.Namespace) -> int:
    stack = _load(args)
    for spec in stack.select(args.filter):
        if spec.skip_build:
            print(f"Skipping build of: {spec.name}.")
            continue
        if args.shrinkwrap:
            out = shrinkwrap(spec, stack.stack_dir)
            print(f"{spec.name} shrink-wrapped to {_rel(out)}")
        else:
            print(f"Building: {spec.image} with {spec.lang} template. Please wait..", flush=True)
            record = build_image(spec, stack_dir=stack.stack_dir)
            print(f"Image: {record.image} built.")
    return 0


def _rel(path: Path) -> str:
    try:
        return "./" + str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# -- deploy ------------------------------------------------------------------------------
def deploy_one(client: Client, spec: FunctionSpec, replace: bool = False) -> requests.Response:
    """faas-cli: PUT, and POST on 404; `--replace` sends DELETE then POST."""
    body = spec.to_deployment()
    if replace:
        client.request("DELETE", "/system/functions", json={"functionName": spec.name, **_ns_body(spec.namespace)})
        return client.request("POST", "/system/functions", json=body)
    resp = client.request("PUT", "/system/functions", json=body)
    if resp.status_code == 404:
        resp = client.request("POST", "/system/functions", json=body)
    return resp


def deploy_specs(client: Client, specs: Iterable[FunctionSpec], replace: bool = False) -> list[str]:
    """Deploy each function; all are tried, then a CliError names the ones that failed."""
    deployed, failed = [], []
    for spec in specs:
        print(f"Deploying: {spec.name}.", flush=True)
        resp = deploy_one(client, spec, replace)
        if resp.status_code == 401:
            _check(resp, OK_DEPLOY, f"deploy {spec.name}")
        if resp.status_code in OK_DEPLOY:
            suffix = f".{spec.namespace}" if spec.namespace else ""
            print(f"\nDeployed. {resp.status_code} {resp.reason or 'OK'}.")
            print(f"URL: {client.gateway}/function/{spec.name}{suffix}\n")
            deployed.append(spec.name)
        else:
            print(
                f"faas-gpu: deploy {spec.name}: unexpected status {resp.status_code}: {_message(resp)}",
                file=sys.stderr,
            )
            failed.append(f"{spec.name} ({resp.status_code})")
    if failed:
        raise CliError(f"failed to deploy: {', '.join(failed)}")
    return deployed


def cmd_deploy(args: argparse.Namespace) -> int:
    stack = _load(args)
    deploy_specs(_client(args, stack), stack.select(args.filter), replace=args.replace)
    return 0


def wait_ready(client: Client, name: str, namespace: str | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    params = {"namespace": namespace} if namespace else {}
    while time.monotonic() < deadline:
        resp = client.request("GET", f"/system/function/{name}", params=params)
        if resp.status_code == 200 and (_json(resp, "ready").get("availableReplicas") or 0) > 0:
            return True
        time.sleep(0.2)
    return False


def up_deploy(yaml_path: str | None, gateway: str, ready_timeout_s: float = 180) -> list[str]:
    """Build and deploy every function of the stack file, then wait until each serves (for `up`)."""
    path = find_stack_file(yaml_path)
    if path is None:
        return []
    stack = load_stack(path)
    client = Client(gateway, credentials(argparse.Namespace(), gateway))
    for spec in stack.functions.values():
        if not spec.skip_build:
            print(f"Building {spec.name} ({spec.image})", flush=True)
            build_image(spec, stack_dir=stack.stack_dir)
    _profile_missing(path, stack)
    names = deploy_specs(client, stack.functions.values())
    for spec in stack.functions.values():
        if not wait_ready(client, spec.name, spec.namespace, ready_timeout_s):
            raise CliError(
                f"{spec.name} did not become ready within {ready_timeout_s:.0f}s; see `faas-gpu logs {spec.name}`"
            )
    return names


def _profile_missing(path: Path, stack) -> None:
    """Profile the models the autoscaler will predict that have no profile yet (once per state folder)."""
    from faas_gpu.profiling.cli import MODEL_ANNOTATION, SOURCE_ANNOTATION
    from faas_gpu.profiling.cli import main as profile_main
    from faas_gpu.profiling.predictor import LatencyPredictor
    from faas_gpu.profiling.store import ProfileStore, profiles_db

    with ProfileStore(profiles_db()) as store:
        predictor = LatencyPredictor(store)
        missing = [
            spec.name
            for spec in stack.functions.values()
            if SOURCE_ANNOTATION in (spec.annotations or {})
            and not predictor.has((spec.annotations or {}).get(MODEL_ANNOTATION) or spec.name)
        ]
    for name in missing:
        print(f"Profiling {name}'s model for the autoscaler (once)", flush=True)
        if profile_main(["-f", str(path), name, "--repeat", "5"]) != 0:
            raise CliError(f"profiling {name} failed; run `faas-gpu profile -f {path} {name}` to see why")


# -- list / describe ---------------------------------------------------------------------
def _list(client: Client, namespace: str | None) -> list[dict]:
    params = {"namespace": namespace} if namespace else None
    fns = _json(_check(client.request("GET", "/system/functions", params=params), (200,), "list"), "list")
    if not isinstance(fns, list):
        raise CliError("list: the gateway did not answer with a JSON array")
    return fns


def cmd_list(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    fns = sorted(_list(client, args.namespace), key=lambda f: str(f.get("name", "")))
    if args.verbose:
        print(f"{'Function':<30}\t{'Image':<30}\t{'Invocations':<15}\t{'Replicas':<5}")
        for f in fns:
            print(
                f"{f.get('name', ''):<30}\t{f.get('image', ''):<30}\t"
                f"{int(f.get('invocationCount') or 0):<15}\t{f.get('replicas') or 0:<5}"
            )
    else:
        print(f"{'Function':<30}\t{'Invocations':<15}\t{'Replicas':<5}")
        for f in fns:
            print(f"{f.get('name', ''):<30}\t{int(f.get('invocationCount') or 0):<15}\t{f.get('replicas') or 0:<5}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    params = {"usage": "1"}
    if args.namespace:
        params["namespace"] = args.namespace
    resp = client.request("GET", f"/system/function/{args.name}", params=params)
    if resp.status_code == 404:
        raise CliError(f"No such function: {args.name}")
    f = _json(_check(resp, (200,), f"describe {args.name}"), "describe")
    invocations = f.get("invocationCount") or 0
    for other in _list(client, args.namespace):  # faas-cli reads invocationCount from the list
        if other.get("name") == f.get("name"):
            invocations = other.get("invocationCount") or invocations
    suffix = f".{args.namespace}" if args.namespace else ""
    rows: list[tuple[str, object]] = [
        ("Name", f.get("name", args.name)),
        ("Status", _status_text(f)),
        ("Replicas", f.get("replicas") or 0),
        ("Available Replicas", f.get("availableReplicas") or 0),
        ("Invocations", int(invocations)),
        ("Image", f.get("image", "")),
        ("Function Process", f.get("envProcess") or "<default>"),
        ("URL", f"{client.gateway}/function/{args.name}{suffix}"),
        ("Async URL", f"{client.gateway}/async-function/{args.name}{suffix}"),
    ]
    for key, title in (
        ("labels", "Labels"),
        ("annotations", "Annotations"),
        ("envVars", "Environment"),
        ("constraints", "Constraints"),
        ("secrets", "Secrets"),
        ("requests", "Requests"),
        ("limits", "Limits"),
    ):
        value = f.get(key)
        if isinstance(value, dict) and value:
            rows.append((title, ", ".join(f"{k}: {v}" for k, v in sorted(value.items()))))
        elif isinstance(value, list) and value:
            rows.append((title, ", ".join(map(str, value))))
    usage = f.get("usage") or {}
    if usage.get("totalMemoryBytes"):
        rows.append(("RAM", f"{usage['totalMemoryBytes'] / 1024 / 1024:.2f} MB"))
    if usage.get("cpu") is not None and usage:
        rows.append(("CPU", f"{usage['cpu']:.0f} Mi"))
    for k, v in rows:
        print(f"{k + ':':<20} {v}")
    ns_only = {"namespace": args.namespace} if args.namespace else {}
    resp = client.request("GET", f"/system/function/{args.name}/instances", params=ns_only)
    if resp.status_code == 200:
        _print_instances(_json(resp, "describe instances"))
    return 0


def _status_text(f: dict) -> str:
    """Ready / Not Ready as faas-cli, or faas-gpu's state of a function that cannot serve."""
    problem = f.get("faasGpuStatus")
    if isinstance(problem, dict) and problem.get("state"):
        return f"{problem['state']} ({problem.get('message', '')})"
    return "Ready" if (f.get("availableReplicas") or 0) > 0 else "Not Ready"


def _print_instances(d: dict) -> None:
    """The autoscaler's decisions for a managed function: one row per (non-uniform) instance."""
    if not d.get("managed"):
        return
    if d.get("policy") == "harmonybatch":
        _print_groups(d)
        return
    if d.get("policy") == "protean":
        print(
            f"{'Scaling:':<20} protean: one container per batch of {d.get('batch')}; {d.get('requests', 0)} "
            f"requests in flight at the last tick need {d.get('needed', 0)}, {d.get('replicas', 0)} desired; "
            f"surplus ones stop after {d.get('surplusWindowS', 0):g} s"
        )
        for i in d.get("instances") or []:
            print(f"  {i['id']:<36} ready: {'yes' if i.get('ready') else 'no'}")
        return
    ka = d.get("keepAlive") or {}
    effort = ", best effort" if d.get("bestEffort") else ""
    print(f"{'Model:':<20} {d.get('model')} (SLO {d.get('sloMs'):g} ms{effort})")
    span = f"[{d.get('rMin', 0):g}, {d.get('rMax', 0):g}]"
    print(f"{'Load:':<20} {d.get('rps', 0):.1f} rps; instances take {span} ({d.get('case')})")
    if ka.get("scaleZero"):
        windows = f"pre-warm {ka.get('prewarmS', 0):g} s, keep-alive {ka.get('keepAliveS', 0):g} s, scale to zero"
    else:
        windows = "never below com.openfaas.scale.min; com.faas-gpu.scale-zero: true lets it idle to zero"
    print(f"{'Keep-alive:':<20} {ka.get('policy')} ({windows})")
    head = ("INSTANCE", "B", "CPU", "GPU%", "EXEC ms", "R_LOW", "R_UP", "RATE")
    print("{:<28} {:>3} {:>4} {:>5} {:>8} {:>6} {:>6} {:>7}  READY".format(*head))
    for i in d.get("instances") or []:
        print(
            f"{i['id']:<28} {i['batch']:>3} {i['cpu']:>4g} {i['gpuShare']:>5g} {i['tExecMs']:>8.2f} "
            f"{i['rLow']:>6g} {i['rUp']:>6g} {i['rate']:>7.1f}  {'yes' if i.get('ready') else 'no'}"
        )


def _print_groups(d: dict) -> None:
    """HarmonyBatch's plan: the apps, and one pool per group with its batch and per-app timeouts."""
    apps = ", ".join(f"{a['name']} ({a['sloMs']:g} ms, {a['rate']:.1f} rps)" for a in d.get("apps") or [])
    print(f"{'Plan:':<20} harmonybatch ({d.get('strategy')}), model {d.get('model')}; apps {apps}")
    cost = d.get("predictedCostPerRequest")
    if cost is not None:
        print(f"{'Predicted cost:':<20} {cost:.4g} per request, {d.get('predictedCostPerSecond') or 0:.4g} per second")
    for g in d.get("instances") or []:
        size = f"{g['vcpu']:g} vCPU" if g["kind"] == "cpu" else f"{g['gpuMemoryGb']} GB GPU"
        timeouts = ", ".join(f"{k} {v:g} ms" for k, v in sorted(g["timeoutsMs"].items()))
        print(f"  {g['id']:<36} {g['kind']:<4} {size:<12} batch {g['batch']:<3} {'+'.join(g['apps'])}; {timeouts}")


# -- invoke / logs -----------------------------------------------------------------------
def cmd_invoke(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    if sys.stdin.isatty():
        print("Reading from STDIN - hit (Control + D) to stop.", file=sys.stderr)
    data = sys.stdin.buffer.read()
    headers = _kv(args.header, "--header")
    query = _kv(args.query, "--query")
    if args.content_type:
        headers["Content-Type"] = args.content_type
    if args.callback_url:
        headers["X-Callback-Url"] = args.callback_url
    route = "async-function" if args.async_ else "function"
    path = f"/{route}/{args.name}.{args.namespace or DEFAULT_NAMESPACE}"
    resp = client.request(
        args.method.upper(),
        path,
        system=False,
        data=data,
        headers=headers,
        params=query,
        timeout=(CONNECT_TIMEOUT_S, None),
    )
    if args.async_:
        if resp.status_code != 202:
            raise CliError(f"invoke {args.name}: unexpected status {resp.status_code}: {_message(resp)}")
        print(f"Function submitted asynchronously. X-Call-Id: {resp.headers.get('X-Call-Id', '')}", file=sys.stderr)
        return 0
    if not 200 <= resp.status_code < 300:
        raise CliError(f"Server returned unexpected status code: {resp.status_code} - {_message(resp)}")
    sys.stdout.buffer.write(resp.content)
    sys.stdout.flush()
    return 0


def parse_go_duration(text: str) -> float:
    """A Go duration (`5m`, `1h30m`, `90s`, `1.5h`) in seconds; a bare number means seconds
    (`faas_gpu.contract.duration`, the provider's parser too)."""
    try:
        return parse_duration(text)
    except ValueError:
        raise CliError(f"--since: {text.strip()!r} is not a duration like 30s, 5m or 1h30m") from None


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    params = {"name": args.name, "follow": str(args.follow).lower(), "tail": str(args.tail)}
    if args.namespace:
        params["namespace"] = args.namespace
    if args.since_time:
        params["since"] = args.since_time
    elif args.since:
        since = datetime.now(UTC) - timedelta(seconds=parse_go_duration(args.since))
        params["since"] = since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if args.instance:
        params["instance"] = args.instance
    resp = client.request(
        "GET",
        "/system/logs",
        params=params,
        stream=True,
        timeout=(CONNECT_TIMEOUT_S, None if args.follow else TIMEOUT_S),
    )
    if resp.status_code in (404, 501):
        raise CliError(f"logs {args.name}: the provider does not serve logs ({resp.status_code}: {_message(resp)})")
    _check(resp, (200,), f"logs {args.name}")
    try:
        for line in resp.iter_lines():
            if not line.strip():
                continue
            try:
                m = json.loads(line)
                print(f"{m['timestamp']} {m['name']} ({m.get('instance', '')}) {str(m['text']).rstrip()}", flush=True)
            except (ValueError, KeyError, TypeError):
                print(line.decode(errors="replace"), flush=True)
    except requests.RequestException as exc:
        raise CliError(f"logs {args.name}: the stream broke: {exc}") from None
    return 0


# -- remove ------------------------------------------------------------------------------
def cmd_remove(args: argparse.Namespace) -> int:
    stack = _load(args, required=bool(getattr(args, "yaml", None)) or not args.name)
    client = _client(args, stack)
    if args.name:
        names = [args.name]
    else:
        names = [s.name for s in stack.select(args.filter)]
    failed = False
    for name in names:
        spec = stack.functions.get(name) if stack else None
        ns = args.namespace or (spec.namespace if spec else None)
        print(f"Deleting: {name}{'.' + ns if ns else ''}.")
        resp = client.request("DELETE", "/system/functions", json={"functionName": name, **_ns_body(ns)})
        if resp.status_code == 404:
            print(f"faas-gpu: No existing function to remove: {name}", file=sys.stderr)
            failed = True
            continue
        _check(resp, (200, 201, 202), f"remove {name}")
        print("Removing old function.")
    return 1 if failed else 0


# -- secrets -----------------------------------------------------------------------------
def cmd_secret(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    ns = args.namespace
    action = {"ls": "list", "rm": "remove"}.get(args.action, args.action)
    if action == "list":
        params = {"namespace": ns} if ns else None
        items = _json(
            _check(client.request("GET", "/system/secrets", params=params), (200,), "secret list"), "secret list"
        )
        print("NAME")
        for s in items or []:
            print(s.get("name", "") if isinstance(s, dict) else s)
        return 0
    if not args.name:
        raise CliError(f"secret {action}: a secret name is required")
    if action == "remove":
        resp = client.request("DELETE", "/system/secrets", json={"name": args.name, **_ns_body(ns)})
        if resp.status_code == 404:
            raise CliError(f"secret remove {args.name}: no such secret")
        _check(resp, (200, 202), f"secret remove {args.name}")  # faas-cli: 204 is an error
        print("Removed.. OK.")
        return 0
    body: dict = {"name": args.name, **_ns_body(ns)}
    if args.from_literal is not None and args.from_file:
        raise CliError(f"secret {action}: give --from-literal or --from-file, not both")
    if args.from_literal is not None:
        body["value"] = args.from_literal
    elif args.from_file:
        try:
            body["rawValue"] = base64.b64encode(Path(args.from_file).read_bytes()).decode()
        except OSError as exc:
            raise CliError(f"secret {action}: cannot read {args.from_file}: {exc.strerror}") from None
    else:
        if sys.stdin.isatty():
            print("Reading from STDIN - hit (Control + D) to stop.", file=sys.stderr)
        body["value"] = sys.stdin.read().strip()
    if not body.get("value") and not body.get("rawValue"):
        raise CliError(f"secret {action}: the secret value is empty")
    method = "POST" if action == "create" else "PUT"
    print(f"{'Creating' if method == 'POST' else 'Updating'} secret: {args.name}{'.' + ns if ns else ''}")
    resp = client.request(method, "/system/secrets", json=body)
    if resp.status_code == 409:
        raise CliError(f"secret {args.name} already exists; use `faas-gpu secret update`")
    if resp.status_code == 404 and method == "PUT":
        raise CliError(f"secret {args.name} does not exist; use `faas-gpu secret create`")
    _check(resp, (200, 201, 202), f"secret {action} {args.name}")
    print(f"{'Created' if method == 'POST' else 'Updated'}: {resp.status_code} {resp.reason or 'OK'}")
    return 0


# -- templates and new -------------------------------------------------------------------
def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _git(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CliError(f"template pull: git failed: {exc}") from None


def _repo_sha(repo: Path) -> str:
    proc = _git("-C", str(repo), "rev-parse", "HEAD")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def template_pull(dest_root: Path, source: str | None = None, overwrite: bool = True) -> list[str]:
    """Write ./template/<lang>/ and meta.json (repository, sha, written_at), as `faas-cli template pull`.

    No source (or `python3-gpu`): this repository's templates/. Otherwise a git repository (a
    local path or URL, `#ref` for a branch or tag) whose `template/` folder is copied. Existing
    templates are kept unless `overwrite` (faas-cli's --overwrite); returns the languages written.
    """
    tmp = None
    try:
        if not source or source == "python3-gpu":
            src_root, repository, sha = paths.TEMPLATES_DIR, str(paths.REPO_ROOT), _repo_sha(paths.REPO_ROOT)
        else:
            repository, _, ref = source.partition("#")
            local = Path(repository).expanduser()
            if local.is_dir() and not (local / ".git").exists() and (local / "template").is_dir():
                src_root, sha = local / "template", ""
            else:
                tmp = Path(tempfile.mkdtemp(prefix="faas-gpu-template-"))
                cmd = [
                    "clone",
                    "--depth",
                    "1",
                    "-q",
                    *(["--branch", ref] if ref else []),
                    repository,
                    str(tmp / "repo"),
                ]
                proc = _git(*cmd)
                if proc.returncode != 0:
                    raise CliError(f"template pull: cannot clone {source}: {proc.stderr.strip().splitlines()[-1:]}")
                src_root, sha = tmp / "repo" / "template", _repo_sha(tmp / "repo")
        if not src_root.is_dir():
            raise CliError(f"template pull: {source} has no template/ folder")
        written, kept = [], []
        for tdir in sorted(p for p in src_root.iterdir() if (p / "template.yml").is_file()):
            dest = dest_root / "template" / tdir.name
            if dest.exists() and not overwrite:
                kept.append(tdir.name)
                continue
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(tdir, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
            meta = {"repository": repository, "sha": sha, "written_at": _now_rfc3339()}
            (dest / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            written.append(tdir.name)
        if kept:
            print(f"Cannot overwrite the following {len(kept)} template(s): {kept} (use --overwrite)")
        return written
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def cmd_template(args: argparse.Namespace) -> int:
    written = template_pull(Path.cwd(), args.repository, overwrite=args.overwrite)
    print(f"Wrote {len(written)} template(s) to ./template: {', '.join(written) or '-'}")
    return 0


def _stack_entry(name: str, lang: str, image: str) -> str:
    return f"  {name}:\n    lang: {lang}\n    handler: ./{name}\n    image: {image}\n"


def cmd_new(args: argparse.Namespace) -> int:
    name = args.name
    if not NAME_RE.match(name):
        raise CliError(f"new: function name {name!r} must match {NAME_RE.pattern}")
    cwd = Path.cwd()
    stack_file = Path(args.append) if args.append else cwd / "stack.yaml"
    if args.append:
        if not stack_file.is_file():
            raise CliError(f"new --append: {stack_file} does not exist")
        try:
            existing = yaml.safe_load(stack_file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise CliError(f"new --append: {stack_file}: not valid YAML: {exc}") from None
        if name in ((existing.get("functions") or {}) if isinstance(existing, dict) else {}):
            raise CliError(f"new: function {name} already exists in {stack_file}")
    elif stack_file.exists():
        raise CliError(f"new: {stack_file.name} already exists; use --append {stack_file.name}")
    dest = cwd / name
    if dest.exists():
        raise CliError(f"new: folder ./{name} already exists")
    template = load_template(find_template(args.lang, cwd))
    handler_src = template.path / template.handler_folder
    if handler_src.is_dir():
        shutil.copytree(handler_src, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    else:
        dest.mkdir()
    image = f"{args.prefix.rstrip('/')}/{name}:latest" if args.prefix else f"{name}:latest"
    entry = _stack_entry(name, args.lang, image)
    if args.append:
        text = stack_file.read_text()
        stack_file.write_text(text + ("" if text.endswith("\n") else "\n") + "\n" + entry)
    else:
        gateway = _norm(args.gateway) if args.gateway else DEFAULT_GATEWAY
        stack_file.write_text(f"version: 1.0\nprovider:\n  name: openfaas\n  gateway: {gateway}\nfunctions:\n{entry}")
    gitignore = cwd / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    for ignore in ("template", "build", ".secrets"):
        if ignore not in lines:
            lines.append(ignore)
    gitignore.write_text("\n".join(lines) + "\n")
    if template.welcome_message.strip():
        print(template.welcome_message.strip())
    print(
        f"\nFunction created in folder: {name}\nStack file {'updated' if args.append else 'written'}: {stack_file.name}"
    )
    return 0


# -- version -----------------------------------------------------------------------------
def cmd_version(args: argparse.Namespace) -> int:
    print(f"faas-gpu CLI:\n version: {__version__}")
    client = _client(args, None)
    try:
        resp = client.request("GET", "/system/info", timeout=3)
        info = resp.json() if resp.status_code == 200 else None
    except (CliError, ValueError):
        info = None
    if not isinstance(info, dict):
        return 0
    provider = info.get("provider")
    if isinstance(provider, dict):  # the gateway's GatewayInfo wraps ProviderInfo
        name, orchestration, version = provider.get("provider"), provider.get("orchestration"), provider.get("version")
    else:  # a provider answering directly
        name, orchestration, version = provider, info.get("orchestration"), info.get("version")
    version = version if isinstance(version, dict) else {}
    print(f"\nGateway\n uri: {client.gateway}")
    print(f"\nProvider\n name: {name}\n orchestration: {orchestration}")
    print(f" version: {version.get('release', '')}\n sha: {version.get('sha', '')}")
    return 0


# -- parser ------------------------------------------------------------------------------
def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _common(p: argparse.ArgumentParser, stack: bool = True) -> None:
    p.add_argument("-g", "--gateway", help=f"gateway URL (default: stack file, $OPENFAAS_URL, {DEFAULT_GATEWAY})")
    p.add_argument("-u", "--username", help="basic-auth user (default: the stack's credentials files)")
    p.add_argument("-p", "--password", help="basic-auth password")
    if stack:
        p.add_argument("-f", "--yaml", help="stack file (default ./stack.yaml, then ./stack.yml)")
        p.add_argument(
            "--envsubst", type=_bool, nargs="?", const=True, default=True, help="substitute ${VAR} (default true)"
        )
        p.add_argument("--no-envsubst", dest="envsubst", action="store_false", help="no ${VAR} substitution")


DELEGATED = {
    "up": ("faas_gpu.up", "main", "start the stack, then build and deploy stack.yml"),
    "down": ("faas_gpu.up", "down_main", "stop the stack"),
    "sim": ("faas_gpu.sim.cli", "main", "replay a trace against the placement policies"),
    "serve": ("provider.server", "main", "run the stack in the foreground (what `up` starts)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faas-gpu", description="GPU-aware serverless inference for OpenFaaS")
    parser.add_argument("--version", action="version", version=f"faas-gpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, (_, _, help_text) in DELEGATED.items():
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)

    from faas_gpu.profiling.cli import add_parser as add_profile_parser
    from faas_gpu.profiling.colocation_cli import add_parser as add_colocation_parser
    from faas_gpu.profiling.fit_cli import add_parser as add_fit_parser

    add_profile_parser(sub)
    add_colocation_parser(sub)
    add_fit_parser(sub)

    p = sub.add_parser("build", help="shrink-wrap functions and build them into the local image store")
    _common(p)
    p.add_argument("--filter", help="only this function")
    p.add_argument("--shrinkwrap", action="store_true", help="only write build/<fn>/, as faas-cli does")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("deploy", help="deploy the functions of a stack file")
    _common(p)
    p.add_argument("--filter", help="only this function")
    p.add_argument("--replace", action="store_true", help="delete, then create")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("list", aliases=["ls"], help="list functions")
    _common(p)
    p.add_argument("-n", "--namespace")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("describe", help="describe a function")
    _common(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("invoke", help="invoke a function with stdin as the body")
    _common(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.add_argument("-a", "--async", dest="async_", action="store_true", help="use /async-function (202)")
    p.add_argument("-H", "--header", action="append", help="header key=value (repeatable)")
    p.add_argument("--query", action="append", help="query key=value (repeatable)")
    p.add_argument("-m", "--method", default="POST")
    p.add_argument("--content-type")
    p.add_argument("--callback-url", help="X-Callback-Url for --async")
    p.set_defaults(func=cmd_invoke)

    p = sub.add_parser("logs", help="print a function's logs")
    _common(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.add_argument("--tail", "--lines", dest="tail", type=int, default=-1, help="lines to show (-1: all)")
    p.add_argument("--since", help="only logs newer than this duration (30s, 5m, 1h)")
    p.add_argument("--since-time", help="only logs after this RFC3339 time")
    p.add_argument("--instance")
    p.add_argument("--follow", action=argparse.BooleanOptionalAction, default=True)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("remove", aliases=["rm", "delete"], help="remove a function (or those of a stack file)")
    _common(p)
    p.add_argument("name", nargs="?")
    p.add_argument("--filter", help="with -f: only this function")
    p.add_argument("-n", "--namespace")
    p.set_defaults(func=cmd_remove)

    p = sub.add_parser("secret", help="manage secrets: create|update|list|remove NAME")
    p.add_argument("action", choices=["create", "update", "list", "ls", "remove", "rm"])
    p.add_argument("name", nargs="?")
    _common(p)
    p.add_argument("-n", "--namespace")
    p.add_argument("--from-literal")
    p.add_argument("--from-file")
    p.set_defaults(func=cmd_secret)

    p = sub.add_parser("new", help="create a function from a template (offline)")
    p.add_argument("name")
    p.add_argument("--lang", default="python3-gpu", help="template (default python3-gpu)")
    p.add_argument("-a", "--append", help="add to this stack file instead of writing stack.yaml")
    p.add_argument("-p", "--prefix", help="image prefix, e.g. your registry user")
    p.add_argument("-g", "--gateway", help=f"gateway written to the stack file (default {DEFAULT_GATEWAY})")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("template", help="templates")
    tsub = p.add_subparsers(dest="template_command", required=True, metavar="pull")
    tp = tsub.add_parser("pull", help="write ./template/<lang>/ (faas-cli's layout)")
    tp.add_argument("repository", nargs="?", help="python3-gpu (default), or a git repository with template/")
    tp.add_argument("--overwrite", action="store_true", help="replace templates already in ./template")
    tp.set_defaults(func=cmd_template)

    p = sub.add_parser("version", help="versions of the CLI and of the gateway")
    _common(p, stack=False)
    p.set_defaults(func=cmd_version)
    return parser


def _fail(exc: BaseException) -> int:
    print(f"faas-gpu: {exc}", file=sys.stderr)
    return 1


PROJECT_COMMANDS = ("new", "template")
"""Commands that write only into the user's project; every other one may write the state folder."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    private = not argv or argv[0] not in PROJECT_COMMANDS
    previous = os.umask(paths.PRIVATE_UMASK) if private else None
    try:
        return _main(argv)
    finally:
        if previous is not None:
            os.umask(previous)  # called in-process (tests), the caller's umask comes back


def _main(argv: list[str]) -> int:
    """Every command; state.db, logs, pid files and images come out 0700 / 0600, like the secrets."""
    try:
        if argv and argv[0] in DELEGATED:  # everything after the word goes to the other module
            module, func, _ = DELEGATED[argv[0]]
            return getattr(importlib.import_module(module), func)(argv[1:]) or 0
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (CliError, StackError, BuildError) as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
