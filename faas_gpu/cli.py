"""`faas-gpu`: the CLI. Reads the same stack.yml as faas-cli and makes the same REST calls."""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import requests
import yaml

from faas_gpu import __version__, paths
from faas_gpu.build import build as build_image
from faas_gpu.build import find_template, shrinkwrap, template_info
from faas_gpu.imagestore import BuildError
from faas_gpu.stack import DEFAULT_GATEWAY, NAME_RE, Stack, StackError, find_stack_file, load_stack

DEFAULT_NAMESPACE = "openfaas-fn"
TIMEOUT_S = 30


class CliError(Exception):
    pass


# -- gateway and credentials -------------------------------------------------------------
def gateway_url(flag: str | None, stack: Stack | None) -> str:
    """faas-cli's precedence: --gateway > stack provider.gateway > OPENFAAS_URL > default."""
    if flag and flag.rstrip("/") != DEFAULT_GATEWAY:
        url = flag
    elif stack and stack.gateway != DEFAULT_GATEWAY:
        url = stack.gateway
    elif os.environ.get("OPENFAAS_URL"):
        url = os.environ["OPENFAAS_URL"]
    else:
        url = flag or DEFAULT_GATEWAY
    return url.lower().rstrip("/")


def _faas_cli_token(gateway: str) -> str | None:
    if os.environ.get("OPENFAAS_CONFIG"):
        config = Path(os.environ["OPENFAAS_CONFIG"]) / "config.yml"
    elif os.environ.get("CI", "").lower() in ("true", "1"):
        config = Path.cwd() / ".openfaas" / "config.yml"
    else:
        config = Path.home() / ".openfaas" / "config.yml"
    try:
        data = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    for entry in data.get("auths") or []:
        if str(entry.get("gateway", "")).rstrip("/") == gateway and entry.get("auth") == "basic":
            return entry.get("token")
    return None


def credentials(args: argparse.Namespace, gateway: str) -> tuple[str, str] | None:
    if getattr(args, "username", None) and getattr(args, "password", None):
        return (args.username, args.password)
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
        user, _, password = base64.b64decode(token).decode().partition(":")
        return (user, password)
    return None


class Client:
    def __init__(self, gateway: str, auth: tuple[str, str] | None):
        self.gateway = gateway
        self.session = requests.Session()
        if auth:
            self.session.auth = auth

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", TIMEOUT_S)
        try:
            return self.session.request(method, self.gateway + path, **kwargs)
        except requests.ConnectionError:
            raise CliError(f"cannot reach gateway at {self.gateway}: is the stack running (faas-gpu up)?") from None
        except requests.Timeout:
            raise CliError(f"gateway at {self.gateway} did not answer within {kwargs['timeout']}s") from None


def _check(resp: requests.Response, ok: tuple[int, ...], what: str) -> requests.Response:
    if resp.status_code == 401:
        raise CliError(f"{what}: unauthorized (401); check the credentials in {paths.secrets_dir()}")
    if resp.status_code not in ok:
        raise CliError(f"{what}: server returned {resp.status_code}: {resp.text.strip()}")
    return resp


def _load(args: argparse.Namespace, required: bool = True) -> Stack | None:
    path = find_stack_file(getattr(args, "yaml", None))
    if path is None:
        if required:
            raise CliError("no stack file: give -f stack.yml (or create ./stack.yaml)")
        return None
    return load_stack(path, substitute=not getattr(args, "no_envsubst", False))


def _client(args: argparse.Namespace, stack: Stack | None = None) -> Client:
    gw = gateway_url(getattr(args, "gateway", None), stack)
    return Client(gw, credentials(args, gw))


# -- commands ----------------------------------------------------------------------------
def cmd_build(args: argparse.Namespace) -> int:
    stack = _load(args)
    for spec in stack.select(args.filter):
        if spec.skip_build:
            print(f"Skipping build of {spec.name} (skip_build)")
            continue
        if args.shrinkwrap:
            out = shrinkwrap(spec)
            print(f"{spec.name} shrink-wrapped to {out}")
        else:
            record = build_image(spec)
            print(f"Image: {record.image} built.")
    return 0


def deploy_specs(client: Client, specs, replace: bool = False) -> list[str]:
    deployed = []
    for spec in specs:
        body = spec.to_deployment()
        if replace:
            client.request(
                "DELETE",
                "/system/functions",
                json={"functionName": spec.name, "namespace": spec.namespace or DEFAULT_NAMESPACE},
            )
            resp = client.request("POST", "/system/functions", json=body)
        else:
            resp = client.request("PUT", "/system/functions", json=body)
            if resp.status_code == 404:
                resp = client.request("POST", "/system/functions", json=body)
        _check(resp, (200, 202), f"deploy {spec.name}")
        print(f"Deployed. {resp.status_code} Accepted.\nURL: {client.gateway}/function/{spec.name}")
        deployed.append(spec.name)
    return deployed


def cmd_deploy(args: argparse.Namespace) -> int:
    stack = _load(args)
    deploy_specs(_client(args, stack), stack.select(args.filter), replace=args.replace)
    return 0


def wait_ready(client: Client, name: str, namespace: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        resp = client.request("GET", f"/system/function/{name}", params={"namespace": namespace})
        if resp.status_code == 200 and resp.json().get("availableReplicas", 0) > 0:
            return True
        time.sleep(0.2)
    return False


def up_deploy(yaml_path: str | None, gateway: str, ready_timeout_s: float = 180) -> list[str]:
    """Build and deploy every function of the stack file; wait until each serves (for `up`)."""
    path = find_stack_file(yaml_path)
    if path is None:
        return []
    stack = load_stack(path)
    client = Client(gateway, credentials(argparse.Namespace(), gateway))
    for spec in stack.functions.values():
        if not spec.skip_build:
            print(f"Building {spec.name} ({spec.image})", flush=True)
            build_image(spec)
    names = deploy_specs(client, stack.functions.values())
    for spec in stack.functions.values():
        if not wait_ready(client, spec.name, spec.namespace or DEFAULT_NAMESPACE, ready_timeout_s):
            raise CliError(
                f"{spec.name} did not become ready within {ready_timeout_s:.0f}s; see `faas-gpu logs {spec.name}`"
            )
    return names


def cmd_list(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    params = {"namespace": args.namespace} if args.namespace else None
    fns = _check(client.request("GET", "/system/functions", params=params), (200,), "list").json()
    if args.verbose:
        print(f"{'Function':<30}{'Image':<40}{'Invocations':>12}{'Replicas':>10}")
        for f in fns:
            print(f"{f['name']:<30}{f['image']:<40}{int(f.get('invocationCount', 0)):>12}{f.get('replicas', 0):>10}")
    else:
        print(f"{'Function':<30}{'Invocations':>12}{'Replicas':>10}")
        for f in fns:
            print(f"{f['name']:<30}{int(f.get('invocationCount', 0)):>12}{f.get('replicas', 0):>10}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    params = {"usage": "1", "namespace": args.namespace or DEFAULT_NAMESPACE}
    resp = client.request("GET", f"/system/function/{args.name}", params=params)
    if resp.status_code == 404:
        raise CliError(f"No such function: {args.name}")
    f = _check(resp, (200,), "describe").json()
    status = "Ready" if f.get("availableReplicas", 0) > 0 else "Not Ready"
    rows = [
        ("Name", f["name"]),
        ("Status", status),
        ("Replicas", f.get("replicas", 0)),
        ("Available Replicas", f.get("availableReplicas", 0)),
        ("Invocations", int(f.get("invocationCount", 0))),
        ("Image", f["image"]),
        ("Function Process", f.get("envProcess", "<default>")),
        ("URL", f"{client.gateway}/function/{f['name']}"),
        ("Async URL", f"{client.gateway}/async-function/{f['name']}"),
        ("Labels", json.dumps(f.get("labels", {}))),
        ("Annotations", json.dumps(f.get("annotations", {}))),
    ]
    for k, v in rows:
        print(f"{k + ':':<20} {v}")
    return 0


def cmd_invoke(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    data = sys.stdin.buffer.read() if not sys.stdin.isatty() else b""
    headers = dict(h.split("=", 1) for h in args.header or [])
    query = dict(q.split("=", 1) for q in args.query or [])
    if args.content_type:
        headers["Content-Type"] = args.content_type
    route = "async-function" if args.async_ else "function"
    path = f"/{route}/{args.name}.{args.namespace or DEFAULT_NAMESPACE}"
    resp = client.request(args.method, path, data=data, headers=headers, params=query, auth=None)
    if args.async_:
        _check(resp, (202,), f"invoke {args.name}")
        print(f"Function submitted asynchronously. Call-Id: {resp.headers.get('X-Call-Id')}", file=sys.stderr)
        return 0
    sys.stdout.buffer.write(resp.content)
    sys.stdout.flush()
    if resp.status_code >= 300:
        print(f"Server returned unexpected status code: {resp.status_code}", file=sys.stderr)
        return 1
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    params = {
        "name": args.name,
        "namespace": args.namespace or DEFAULT_NAMESPACE,
        "follow": str(args.follow).lower(),
        "tail": str(args.tail),
    }
    if args.since:
        params["since"] = args.since
    if args.instance:
        params["instance"] = args.instance
    resp = client.request("GET", "/system/logs", params=params, stream=True, timeout=None if args.follow else TIMEOUT_S)
    _check(resp, (200,), f"logs {args.name}")
    try:
        for line in resp.iter_lines():
            if line:
                m = json.loads(line)
                print(f"{m['timestamp']} {m['name']} ({m['instance']}) {m['text']}", flush=True)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    stack = _load(args, required=False)
    client = _client(args, stack)
    names = [args.name] if args.name else [s.name for s in (stack.functions.values() if stack else [])]
    if not names:
        raise CliError("remove: give a function name or -f stack.yml")
    for name in names:
        ns = args.namespace or (stack.functions[name].namespace if stack and name in stack.functions else None)
        resp = client.request(
            "DELETE", "/system/functions", json={"functionName": name, "namespace": ns or DEFAULT_NAMESPACE}
        )
        if resp.status_code == 404:
            raise CliError(f"No existing function to remove: {name}")
        _check(resp, (200, 201, 202), f"remove {name}")
        print(f"Removing old function: {name}")
    return 0


def cmd_secret(args: argparse.Namespace) -> int:
    client = _client(args, _load(args, required=False))
    ns = args.namespace or DEFAULT_NAMESPACE
    if args.action == "list":
        items = _check(client.request("GET", "/system/secrets", params={"namespace": ns}), (200,), "secret list").json()
        print("NAME")
        for s in items:
            print(s["name"])
        return 0
    if not args.name:
        raise CliError(f"secret {args.action}: a secret name is required")
    if args.action == "remove":
        resp = client.request("DELETE", "/system/secrets", json={"name": args.name, "namespace": ns})
        _check(resp, (200, 202), f"secret remove {args.name}")
        print(f"Removed: {args.name}")
        return 0
    if args.from_literal is not None:
        body = {"name": args.name, "namespace": ns, "value": args.from_literal}
    elif args.from_file:
        body = {
            "name": args.name,
            "namespace": ns,
            "rawValue": base64.b64encode(Path(args.from_file).read_bytes()).decode(),
        }
    else:
        body = {"name": args.name, "namespace": ns, "value": sys.stdin.read().strip()}
    method = "POST" if args.action == "create" else "PUT"
    resp = client.request(method, "/system/secrets", json=body)
    if resp.status_code == 409:
        raise CliError(f"secret {args.name} already exists; use `faas-gpu secret update`")
    _check(resp, (200, 201, 202), f"secret {args.action} {args.name}")
    print(f"{'Created' if method == 'POST' else 'Updated'}: {resp.status_code} {args.name}")
    return 0


def template_pull(dest_root: Path, source: str | None = None) -> list[str]:
    """Write ./template/<lang>/ (+ meta.json) so the real `faas-cli new --lang` works offline."""
    if source and source not in ("python3-gpu",) and Path(source).exists():
        tmp = dest_root / ".template-pull"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "clone", "--depth", "1", "-q", source, str(tmp)], check=True)
        src_root, repository = tmp / "template", source
    else:
        src_root, repository, tmp = paths.TEMPLATES_DIR, "faas-gpu", None
    sha = _git_sha()
    pulled = []
    for tdir in sorted(p for p in src_root.iterdir() if (p / "template.yml").is_file()):
        dest = dest_root / "template" / tdir.name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(tdir, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        meta = {"repository": repository, "sha": sha, "written_at": datetime.now(UTC).isoformat()}
        (dest / "meta.json").write_text(json.dumps(meta, indent=2))
        pulled.append(tdir.name)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return pulled


def _git_sha() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(paths.REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cmd_template(args: argparse.Namespace) -> int:
    pulled = template_pull(Path.cwd(), args.repository)
    print(f"Wrote {len(pulled)} template(s) to ./template: {', '.join(pulled)}")
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    name = args.name
    if not NAME_RE.match(name):
        raise CliError(f"new: {name!r} must match {NAME_RE.pattern}")
    cwd = Path.cwd()
    template = find_template(args.lang, cwd)
    handler_folder = template_info(template).get("handler_folder") or "function"
    dest = cwd / name
    if dest.exists():
        raise CliError(f"new: folder ./{name} already exists")
    shutil.copytree(template / handler_folder, dest, ignore=shutil.ignore_patterns("__pycache__"))
    stack_file = Path(args.append) if args.append else cwd / "stack.yaml"
    image = f"{args.prefix.rstrip('/') + '/' if args.prefix else ''}{name}:latest"
    entry = {"lang": args.lang, "handler": f"./{name}", "image": image}
    if args.append:
        if not stack_file.exists():
            raise CliError(f"new --append: {stack_file} does not exist")
        data = yaml.safe_load(stack_file.read_text()) or {}
        data.setdefault("functions", {})[name] = entry
    else:
        if stack_file.exists():
            raise CliError(f"new: {stack_file.name} exists; use --append {stack_file.name}")
        data = {
            "version": 1.0,
            "provider": {"name": "openfaas", "gateway": args.gateway or DEFAULT_GATEWAY},
            "functions": {name: entry},
        }
    stack_file.write_text(yaml.safe_dump(data, sort_keys=False))
    gitignore = cwd / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    for ignore in ("template", "build", ".secrets"):
        if ignore not in lines:
            lines.append(ignore)
    gitignore.write_text("\n".join(lines) + "\n")
    print(template_info(template).get("welcome_message", "").strip())
    print(f"Function created in folder: {name}\nStack file written: {stack_file.name}")
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"faas-gpu CLI: {__version__}")
    client = _client(args, None)
    try:
        info = client.request("GET", "/system/info", timeout=3)
    except CliError:
        return 0
    if info.status_code == 200:
        p = info.json().get("provider", {})
        print(f"Gateway: {client.gateway}\nProvider: {p.get('provider')} {p.get('version', {}).get('release', '')}")
    return 0


# -- parser ------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser, stack: bool = True) -> None:
    p.add_argument("-g", "--gateway", help=f"gateway URL (default {DEFAULT_GATEWAY}, or OPENFAAS_URL)")
    p.add_argument("-u", "--username", help="basic-auth user (default: the stack's credentials file)")
    p.add_argument("-p", "--password", help="basic-auth password")
    if stack:
        p.add_argument("-f", "--yaml", help="stack file (default ./stack.yaml, then ./stack.yml)")
        p.add_argument("--no-envsubst", action="store_true", help="no ${VAR} substitution in the stack file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faas-gpu", description="GPU-aware serverless inference for OpenFaaS")
    parser.add_argument("--version", action="version", version=f"faas-gpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("up", help="start the stack and deploy stack.yml", add_help=False)
    sub.add_parser("down", help="stop the stack", add_help=False)
    sub.add_parser("sim", help="run a placement simulation scenario", add_help=False)
    sub.add_parser("serve", help="run the stack in the foreground (what `up` starts)", add_help=False)

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
    p.add_argument("--async", dest="async_", action="store_true")
    p.add_argument("-H", "--header", action="append", help="header k=v (repeatable)")
    p.add_argument("--query", action="append", help="query k=v (repeatable)")
    p.add_argument("-m", "--method", default="POST")
    p.add_argument("--content-type")
    p.set_defaults(func=cmd_invoke)

    p = sub.add_parser("logs", help="stream a function's logs")
    _common(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.add_argument("--tail", type=int, default=-1, help="lines to show (-1 = all)")
    p.add_argument("--since", help="RFC3339 time")
    p.add_argument("--instance")
    p.add_argument("--follow", action=argparse.BooleanOptionalAction, default=True)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("remove", aliases=["rm", "delete"], help="remove a function (or all of a stack file)")
    _common(p)
    p.add_argument("name", nargs="?")
    p.add_argument("-n", "--namespace")
    p.set_defaults(func=cmd_remove)

    p = sub.add_parser("secret", help="manage secrets")
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
    p.add_argument("--append", help="add to this stack file instead of writing stack.yaml")
    p.add_argument("--prefix", help="image prefix, e.g. your registry user")
    p.add_argument("-g", "--gateway")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("template", help="templates")
    tsub = p.add_subparsers(dest="template_command", required=True)
    tp = tsub.add_parser("pull", help="write ./template/<lang>/ (faas-cli's layout)")
    tp.add_argument("repository", nargs="?", help="a local git repository with a template/ folder")
    tp.set_defaults(func=cmd_template)

    p = sub.add_parser("version", help="versions of the CLI and of the gateway")
    _common(p, stack=False)
    p.set_defaults(func=cmd_version)
    return parser


DELEGATED = {
    "up": ("faas_gpu.up", "main"),
    "down": ("faas_gpu.up", "down_main"),
    "sim": ("faas_gpu.sim.cli", "main"),
    "serve": ("provider.server", "main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        module, func = DELEGATED[argv[0]]
        try:
            return getattr(importlib.import_module(module), func)(argv[1:])
        except (CliError, StackError, BuildError) as exc:
            print(f"faas-gpu: {exc}", file=sys.stderr)
            return 1
    args = build_parser().parse_args(argv)
    if getattr(args, "action", None) in ("ls", "rm"):
        args.action = {"ls": "list", "rm": "remove"}[args.action]
    try:
        return args.func(args)
    except (CliError, StackError, BuildError) as exc:
        print(f"faas-gpu: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
