"""deploy/ read against the schemas and against the code: what the files ask of the daemons exists.

Why: a deploy file is only read when someone deploys it, so a flag renamed in a parser, an env
variable dropped from the contract, a scrape target left pointing at a service that moved, or a
manifest field misspelt shows up on a user's cluster and nowhere else. Here every manifest is
validated against Kubernetes's JSON schemas (`kubernetes-validate`, offline, strict: unknown
fields fail), the compose and Swarm files against the compose-spec schema (the copy
`check-jsonschema` vendors), every daemon command is parsed by that daemon's own argparse parser,
every `FAAS_GPU_*` variable is found in the contract's table (or the entry point), and the
Prometheus and Grafana wiring names services the same file defines.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema

from faas_gpu.contract import env as contract_env
from faas_gpu.paths import REPO_ROOT
from tests.module_files import load

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
SWARM = DEPLOY / "swarm-stack.yml"
KUBERNETES = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
PROMETHEUS_SWARM = DEPLOY / "prometheus" / "prometheus-swarm.yml"
ENTRYPOINT = DEPLOY / "entrypoint.sh"

# Kubernetes releases the manifests must be valid for: the oldest still commonly run and the newest
# the validator knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

# Flags the deploy files use that another helper's branch adds (issue 16): `faas-gpu serve
# --runtime local|docker|swarm` (the Docker and Swarm runtimes). Until the parser has it, the flag
# test leaves it out; `test_pending_flags_are_still_pending` fails once it exists, so this entry
# is deleted then rather than forgotten.

# Daemon -> (module with parse_args, default port of what Prometheus scrapes on it).
DAEMONS = {
    "serve": ("provider.server", None),
    "scheduler": ("scheduler.daemon", 8091),
    "gpu_manager": ("gpu_manager.daemon", 8090),
    "procurer": ("procurer.daemon", None),
}
# Prometheus job -> (daemon, the flag naming the scraped port, its default).
JOB_PORTS = {
    "gateway": ("serve", "--metrics-port", 8082),
    "provider": ("serve", "--provider-port", 8081),
    "scheduler": ("scheduler", "--port", 8091),
    "gpu-manager": ("gpu_manager", "--port", 8090),
    "procurer": ("procurer", "--status-port", 8093),
}
# Jobs of prometheus.yml with no service in docker-compose.yml, on purpose: the procurer drives an
# emulated cloud and runs only where an operator starts one (the file says so).
COMPOSE_JOBS_WITHOUT_SERVICE = {"procurer"}


def _yaml_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _manifests() -> list[Path]:
    return sorted([*KUBERNETES.glob("*.yaml"), *KUBERNETES.glob("*.yaml.example")])


def _kubernetes_objects() -> Iterator[tuple[str, dict]]:
    for path in _manifests():
        for doc in _yaml_documents(path):
            yield f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc


def _workloads() -> dict[str, dict]:
    return {
        doc["metadata"]["name"]: doc
        for _, doc in _kubernetes_objects()
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }


# -- where the daemons are started ------------------------------------------------------------------


def _daemon_of(argv: list[str]) -> tuple[str, list[str]] | None:
    """(daemon, its arguments) for a command line that starts one of ours; None otherwise."""
    if argv[:2] == ["faas-gpu", "serve"]:
        return "serve", argv[2:]
    if len(argv) >= 3 and argv[0] == "python" and argv[1] == "-m" and argv[2] in DAEMONS:
        return argv[2], argv[3:]
    return None


def _compose_commands(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    for name, service in yaml.safe_load(path.read_text())["services"].items():
        command = service.get("command")
        if command is None:
            continue
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        found = _daemon_of(argv)
        if found:
            yield f"{path.name}:{name}", *found


def _kubernetes_commands() -> Iterator[tuple[str, str, list[str]]]:
    for name, workload in _workloads().items():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            found = _daemon_of([*container.get("command", []), *container.get("args", [])])
            if found:
                yield f"kubernetes:{name}/{container['name']}", *found


def _all_commands() -> list[tuple[str, str, list[str]]]:
    return [*_compose_commands(COMPOSE), *_compose_commands(SWARM), *_kubernetes_commands()]


def _parser_accepts(daemon: str, args: list[str]) -> bool:
    module = importlib.import_module(DAEMONS[daemon][0])
    try:
        module.parse_args(args)
    except SystemExit:
        return False
    return True


def _flag(args: list[str], flag: str) -> str | None:
    """The value of `flag` (--flag=v or --flag v) in args; None when absent."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


# -- schemas ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_kubernetes_manifest_is_valid_for_kubernetes(version):
    objects = list(_kubernetes_objects())
    assert len(objects) >= 12
    for where, doc in objects:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where} is not a valid Kubernetes {version} object: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("path", [COMPOSE, SWARM], ids=lambda p: p.name)
def test_compose_and_swarm_files_follow_the_compose_spec(path):
    schema = get_builtin_schema("vendor.compose-spec")
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(yaml.safe_load(path.read_text())), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_validators_reject_a_broken_file():
    """The two validators above are not vacuous: a misspelt field fails each."""
    (_, deployment) = next((w, d) for w, d in _kubernetes_objects() if d["kind"] == "DaemonSet")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["argz"] = ["x"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)
    compose = yaml.safe_load(COMPOSE.read_text())
    compose["services"]["gpu-manager"]["gpuz"] = "all"
    validator = jsonschema.Draft202012Validator(get_builtin_schema("vendor.compose-spec"))
    assert list(validator.iter_errors(compose))


# -- the daemons' flags and environment --------------------------------------------------------------


def test_every_daemon_command_in_the_deploy_files_parses_with_that_daemons_parser(monkeypatch, tmp_path):
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path))  # parse_args resolves the state folder
    commands = _all_commands()
    daemons = {daemon for _, daemon, _ in commands}
    assert {"serve", "scheduler", "gpu_manager"} <= daemons
    for where, daemon, args in commands:
        assert _parser_accepts(daemon, args), f"{where}: {daemon} rejects {args}"


def test_the_runtime_each_file_asks_for():
    """compose: functions as containers on the one engine; Swarm: as services; Kubernetes: none yet."""
    runtimes = {where: _flag(args, "--runtime") for where, daemon, args in _all_commands() if daemon == "serve"}
    assert runtimes == {
        "docker-compose.yml:faas-gpu": "docker",
        "swarm-stack.yml:faas-gpu": "swarm",
        "kubernetes:faas-gpu/faas-gpu": None,  # the local-process runtime: README says so
    }


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _all_env_names() -> set[tuple[str, str]]:
    out = set()
    for path in (COMPOSE, SWARM):
        for name, service in yaml.safe_load(path.read_text())["services"].items():
            out |= {(f"{path.name}:{name}", var) for var in _environment(service)}
    for name, workload in _workloads().items():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            out |= {(f"kubernetes:{name}", e["name"]) for e in container.get("env", [])}
    return out


def test_every_faas_gpu_variable_the_deploy_files_set_is_read_somewhere():
    contract = {v.name for v in vars(contract_env).values() if isinstance(v, contract_env.Var)}
    entrypoint = ENTRYPOINT.read_text()
    names = {var for _, var in _all_env_names() if var.startswith("FAAS_GPU_")}
    assert {"FAAS_GPU_HOME", "FAAS_GPU_CREDENTIALS_DIR"} <= names
    for var in names:
        assert var in contract or re.search(rf"\b{var}\b", entrypoint), f"{var}: not in faas_gpu/contract/env.py"


@pytest.mark.parametrize("path", [COMPOSE, SWARM], ids=lambda p: p.name)
def test_every_variable_a_compose_file_substitutes_is_named_in_its_header(path):
    text = path.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for var in set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text)):
        assert var in header, f"{path.name} substitutes ${{{var}}} without saying so at its top"


# -- the shape of the GPU path ---------------------------------------------------------------------------


def test_swarm_runs_the_gpu_path_across_the_cluster():
    swarm = yaml.safe_load(SWARM.read_text())
    services = swarm["services"]
    assert {"faas-gpu", "scheduler", "gpu-manager", "etcd", "redis", "registry", "prometheus", "grafana"} <= set(
        services
    )
    gateway = services["faas-gpu"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in gateway["volumes"]
    assert gateway["deploy"]["placement"]["constraints"] == ["node.role == manager"]
    manager = services["gpu-manager"]
    assert manager["deploy"]["mode"] == "global"
    assert manager["deploy"]["placement"]["constraints"] == ["node.labels.gpu == true"]
    assert _flag(manager["command"], "--backend") == "auto"  # cuda where NVML finds GPUs, else cpu
    assert manager["environment"]["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert services["scheduler"]["deploy"]["replicas"] == 2
    for name in ("scheduler", "gpu-manager"):  # announced in etcd: the task's own address
        assert _flag(services[name]["command"], "--advertise") == "self"
    for name, target in (("etcd", "/etcd-data"), ("redis", "/data"), ("registry", "/var/lib/registry")):
        assert any(v.endswith(":" + target) and not v.startswith("/") for v in services[name]["volumes"]), name
    assert services["registry"]["ports"] == ["5000:5000"]
    # one cluster token for every daemon, and the gateway's basic auth, from Swarm secrets
    for name in ("faas-gpu", "scheduler", "gpu-manager", "prometheus"):
        tokens = [s for s in services[name]["secrets"] if isinstance(s, dict)]
        assert tokens == [{"source": "faas-gpu-cluster-token", "target": "gpu-manager-token"}], name
    plain = {s for s in services["faas-gpu"]["secrets"] if isinstance(s, str)}
    assert {"basic-auth-user", "basic-auth-password"} <= plain
    assert all(secret == {"external": True} for secret in swarm["secrets"].values())
    network = swarm["networks"]["faas-gpu"]
    assert network["driver"] == "overlay" and network["attachable"] and network["name"] == "faas-gpu"


def test_compose_runs_the_gpu_path_on_one_gpu_box():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"faas-gpu", "scheduler", "scheduler-2", "gpu-manager", "etcd", "redis", "prometheus", "grafana"} <= set(
        services
    )
    assert "/var/run/docker.sock:/var/run/docker.sock" in services["faas-gpu"]["volumes"]
    assert services["faas-gpu"]["build"]["args"]["BASE_IMAGE"].startswith("${FAAS_GPU_BASE_IMAGE:-python:3.11-slim")
    devices = services["gpu-manager"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu", "compute", "utility"]}]
    # every daemon on the host's network, listening on loopback only unless an operator says otherwise
    for name, service in services.items():
        assert service["network_mode"] == "host", name
    for _, _daemon, args in _compose_commands(COMPOSE):
        assert _flag(args, "--bind") in (None, "127.0.0.1")
    ports = [_flag(args, "--port") for _, daemon, args in _compose_commands(COMPOSE) if daemon == "scheduler"]
    assert sorted(ports) == ["8091", "8092"]


def test_kubernetes_runs_the_gpu_manager_per_gpu_node_and_two_schedulers():
    workloads = _workloads()
    manager = workloads["gpu-manager"]
    assert manager["kind"] == "DaemonSet"
    pod = manager["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "true"}
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert workloads["scheduler"]["kind"] == "Deployment" and workloads["scheduler"]["spec"]["replicas"] == 2
    assert workloads["etcd"]["kind"] == "StatefulSet"
    # every Service selects the pods of a workload in the same folder
    for where, doc in _kubernetes_objects():
        if doc["kind"] != "Service":
            continue
        selected = [
            w
            for w in workloads.values()
            if doc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, f"{where} selects no pod"
    # $(NODE_NAME) in the manager's arguments is a variable its container defines
    container = pod["containers"][0]
    for var in re.findall(r"\$\(([A-Z_]+)\)", " ".join(container["args"])):
        assert var in {e["name"] for e in container["env"]}


def test_kubernetes_pods_mount_the_secrets_the_entry_point_copies():
    for name, workload in _workloads().items():
        spec = workload["spec"]["template"]["spec"]
        container = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if "FAAS_GPU_CREDENTIALS_DIR" not in env:
            continue
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(v for v in spec["volumes"] if v["name"] == mounts[env["FAAS_GPU_CREDENTIALS_DIR"]])
        secrets = [volume["secret"]["secretName"]] if "secret" in volume else []
        secrets += [s["secret"]["name"] for s in volume.get("projected", {}).get("sources", [])]
        assert "faas-gpu-cluster-token" in secrets, name
    example = {doc["metadata"]["name"]: doc for doc in _yaml_documents(KUBERNETES / "secrets.yaml.example")}
    assert set(example["faas-gpu-cluster-token"]["stringData"]) == {"gpu-manager-token"}
    assert set(example["basic-auth"]["stringData"]) == {"basic-auth-user", "basic-auth-password"}


# -- Prometheus and Grafana ---------------------------------------------------------------------------


def _port_of(args: list[str], flag: str, default: int) -> int:
    value = _flag(args, flag)
    return int(value) if value is not None else default


def _jobs(path: Path) -> dict[str, dict]:
    return {job["job_name"]: job for job in yaml.safe_load(path.read_text())["scrape_configs"]}


def test_every_swarm_scrape_target_is_a_service_of_the_swarm_file_running_that_daemon():
    services = yaml.safe_load(SWARM.read_text())["services"]
    commands = {where.split(":", 1)[1]: (daemon, args) for where, daemon, args in _compose_commands(SWARM)}
    for name, job in _jobs(PROMETHEUS_SWARM).items():
        daemon, flag, default = JOB_PORTS[name]
        targets = [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        targets += [f"{n}:{sd['port']}" for sd in job.get("dns_sd_configs", []) for n in sd["names"]]
        assert targets, name
        for target in targets:
            host, port = target.rsplit(":", 1)
            service = host.removeprefix("tasks.")
            assert service in services, f"{name}: {target} names no service of {SWARM.name}"
            assert commands[service][0] == daemon, f"{name}: {service} does not run {daemon}"
            assert int(port) == _port_of(commands[service][1], flag, default), target
            if host.startswith("tasks."):  # several tasks: one target each, through Swarm's DNS
                deploy = services[service]["deploy"]
                assert deploy.get("mode") == "global" or deploy.get("replicas", 1) > 1
        if "authorization" in job:
            credentials = job["authorization"]["credentials_file"]
            assert credentials == "/run/secrets/gpu-manager-token"
    assert set(_jobs(PROMETHEUS_SWARM)) == set(JOB_PORTS) - {"procurer"}


def test_every_compose_scrape_target_is_a_port_a_compose_service_listens_on():
    commands = list(_compose_commands(COMPOSE))
    for name, job in _jobs(PROMETHEUS).items():
        daemon, flag, default = JOB_PORTS[name]
        listening = {_port_of(args, flag, default) for _, d, args in commands if d == daemon}
        targets = [t for sc in job["static_configs"] for t in sc["targets"]]
        if name in COMPOSE_JOBS_WITHOUT_SERVICE:
            assert not listening
            continue
        assert {int(t.rsplit(":", 1)[1]) for t in targets} == listening, name
        assert all(t.startswith("127.0.0.1:") for t in targets), name  # the host's network


def _grafana_prometheus_url(path: Path) -> str:
    url = _environment(yaml.safe_load(path.read_text())["services"]["grafana"])["PROMETHEUS_URL"]
    source = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "${PROMETHEUS_URL}"
    return url


def test_grafanas_data_source_is_the_prometheus_service_of_each_file():
    swarm = yaml.safe_load(SWARM.read_text())["services"]
    url = urlsplit(_grafana_prometheus_url(SWARM))
    assert url.hostname == "prometheus" and "prometheus" in swarm
    assert url.port == 9090 and any(p.endswith(":9090") for p in swarm["prometheus"]["ports"])
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    url = urlsplit(_grafana_prometheus_url(COMPOSE))
    listen = _flag(compose["prometheus"]["command"], "--web.listen-address")
    assert f"{url.hostname}:{url.port}" == listen
    assert compose["prometheus"]["network_mode"] == compose["grafana"]["network_mode"] == "host"


# -- the image and its entry point ---------------------------------------------------------------------------


def test_the_dockerfile_takes_its_base_image_as_a_build_argument():
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions[0] == "ARG BASE_IMAGE=python:3.11-slim"
    assert instructions[1] == "FROM ${BASE_IMAGE}"
    assert "COPY deploy/entrypoint.sh /usr/local/bin/faas-gpu-entrypoint" in instructions


def test_image_deps_lists_only_what_the_python_lacks(tmp_path):
    module = load("image_deps", DEPLOY / "image_deps.py")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\ndependencies = ["pyyaml>=6", "surely-not-installed-xyz>=1"]\n'
        '[project.optional-dependencies]\ntorch = ["another-missing-one==2"]\n'
    )
    assert module.missing(module.requirements(pyproject, [])) == ["surely-not-installed-xyz>=1"]
    assert module.missing(module.requirements(pyproject, ["torch"])) == [
        "surely-not-installed-xyz>=1",
        "another-missing-one==2",
    ]
    # this checkout's own dependencies are all installed in the test venv: nothing to download
    assert module.missing(module.requirements(REPO_ROOT / "pyproject.toml", [])) == []


def _entrypoint(tmp_path: Path, credentials: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "credentials"
    folder.mkdir(parents=True)
    for name, value in credentials.items():
        (folder / name).write_text(value)
    env = {**os.environ, "FAAS_GPU_HOME": str(tmp_path / "home"), "FAAS_GPU_CREDENTIALS_DIR": str(folder)}
    return subprocess.run(["sh", str(ENTRYPOINT), *argv], env=env, capture_output=True, text=True, timeout=30)


def test_the_entry_point_copies_the_cluster_token_and_resolves_advertise_self(tmp_path):
    argv = ("printf", "%s|", "--advertise=self", "--advertise", "self")
    out = _entrypoint(tmp_path, {"gpu-manager-token": "tok"}, *argv)
    assert out.returncode == 0, out.stderr
    first, flag, second = out.stdout.rstrip("|").split("|")
    assert first.startswith("--advertise=") and first != "--advertise=self"
    assert flag == "--advertise" and second == first.split("=", 1)[1]
    token = tmp_path / "home" / "secrets" / "gpu-manager-token"
    assert token.read_text() == "tok" and token.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "home" / "secrets" / "basic-auth-user").exists()


def test_the_entry_point_takes_the_basic_auth_pair_whole_or_not_at_all(tmp_path):
    for half in ({"basic-auth-user": "admin", "gpu-manager-token": "t"}, {"basic-auth-password": "pw"}):
        out = _entrypoint(tmp_path / next(iter(half)), half, "true")
        assert out.returncode == 1 and "only one of" in out.stderr
    out = _entrypoint(tmp_path / "pair", {"basic-auth-user": "admin", "basic-auth-password": "pw"}, "true")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "pair" / "home" / "secrets" / "basic-auth-password").read_text() == "pw"
    out = _entrypoint(tmp_path / "none", {}, "true")
    assert out.returncode == 1 and "holds none of" in out.stderr


def test_promtool_accepts_the_swarm_configuration_with_its_dns_discovery(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool: apt-get install prometheus (make servers)")
    config = yaml.safe_load(PROMETHEUS_SWARM.read_text())
    token = tmp_path / "gpu-manager-token"  # /run/secrets/ exists only in the Swarm task
    token.write_text("t")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config))
    out = subprocess.run([promtool, "check", "config", str(checked)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockers_own_stack_loader_reads_the_swarm_file():
    """`docker stack config` (Docker CLI 25+) loads the file exactly as `docker stack deploy` does,
    with Docker's own schema, variables and merge keys, without an engine."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI")
    env = {**os.environ, "FAAS_GPU_IMAGE": "127.0.0.1:5000/faas-gpu:test", "REGISTRY_IMAGE": "faas-gpu/registry"}
    out = subprocess.run(
        [docker, "stack", "config", "-c", str(SWARM)], capture_output=True, text=True, timeout=60, env=env
    )
    if out.returncode != 0 and "stack config" in out.stderr and "unknown" in out.stderr.lower():
        pytest.skip(f"this docker CLI has no `stack config`: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    rendered = yaml.safe_load(out.stdout)["services"]
    assert set(rendered) == set(yaml.safe_load(SWARM.read_text())["services"])
    for name in ("faas-gpu", "scheduler", "gpu-manager"):
        assert rendered[name]["image"] == "127.0.0.1:5000/faas-gpu:test"
        assert rendered[name]["environment"]["FAAS_GPU_CREDENTIALS_DIR"] == "/run/secrets"
    assert rendered["registry"]["image"] == "faas-gpu/registry"
    manager = rendered["gpu-manager"]
    assert manager["deploy"]["mode"] == "global"
    assert manager["deploy"]["placement"]["constraints"] == ["node.labels.gpu == true"]
    assert manager["hostname"] == "{{.Node.Hostname}}"
    assert manager["environment"]["NVIDIA_VISIBLE_DEVICES"] == "all"


# -- the datastore is no back door: etcd and Redis take no anonymous client (issue 41) -------------------

DATASTORE_SECRETS = ("etcd-credentials", "redis-credentials")


def _enable_auth_args(argv: list[str]) -> list[str] | None:
    """The arguments of a `faas-gpu datastore enable-auth` command line; None for any other."""
    return argv[3:] if argv[:3] == ["faas-gpu", "datastore", "enable-auth"] else None


def _parses_as_enable_auth(args: list[str]) -> bool:
    from provider.datastore_cli import _parser

    try:
        _parser().parse_args(["enable-auth", *args])
    except SystemExit:
        return False
    return True


def test_no_deploy_file_puts_a_datastore_password_on_a_command_line():
    """A login in a URL shows in `ps` on the node (and to a replica beside the daemon): the
    files hand the daemons theirs as secret files, read from their state folder's secrets/."""
    for where, _daemon, args in _all_commands():
        for flag in ("--etcd", "--redis"):
            url = _flag(args, flag)
            assert url is None or "@" not in url, f"{where}: {flag} {url}"


def test_compose_turns_etcd_auth_on_and_gives_redis_an_acl_before_any_daemon_starts():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    init = services["credentials"]
    args = _enable_auth_args(init["command"])
    assert args is not None and _parses_as_enable_auth(args)
    assert _flag(args, "--etcd") == "http://127.0.0.1:2379"
    acl = _flag(args, "--redis-acl")
    assert "faas-gpu-state:/var/lib/faas-gpu" in init["volumes"]  # the daemons' logins land in secrets/
    acl_volume = next(v for v in init["volumes"] if v.split(":")[1] == str(Path(acl).parent))
    redis = services["redis"]
    assert _flag(redis["command"], "--aclfile") == acl
    assert any(v.startswith(acl_volume.split(":")[0] + ":") and v.endswith(":ro") for v in redis["volumes"])
    assert "faas-gpu-state:/var/lib/faas-gpu" not in redis["volumes"]  # Redis sees its ACL, no secret
    assert redis["depends_on"]["credentials"]["condition"] == "service_completed_successfully"
    for where, _daemon, _args in _compose_commands(COMPOSE):
        name = where.split(":")[1]
        assert services[name]["depends_on"]["credentials"]["condition"] == "service_completed_successfully", name
    assert "endpoint" in services["etcd"]["healthcheck"]["test"] and "status" in services["etcd"]["healthcheck"]["test"]


def _shell_acl(command: str, credentials: Path, tmp_path: Path) -> str:
    """Run a file's Redis start command with its login file at `credentials`, up to redis-server."""
    script = command.replace("$$", "$")  # compose's escape (Kubernetes leaves $(...) of no variable)
    script = re.sub(r"/(run/secrets|etc/redis-login)/redis-credentials", str(credentials), script)
    script = script.replace("/tmp/users.acl", str(tmp_path / "users.acl"))
    script = re.sub(r"exec docker-entrypoint\.sh redis-server.*", "true", script)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return (tmp_path / "users.acl").read_text()


def test_swarm_and_kubernetes_build_redis_the_acl_faas_gpu_writes(tmp_path):
    """The same ACL as `faas_gpu.credentials.redis_acl` (the tests' Redis and compose's): default
    user off, the daemons' user on faas-gpu:* with its password hashed; a ':' in it kept."""
    from faas_gpu.credentials import Login, redis_acl

    credentials = tmp_path / "redis-credentials"
    credentials.write_text("faas-gpu:pa:ss")  # as `docker secret create` gets it: no newline
    expected = redis_acl(Login("faas-gpu", "pa:ss"))
    swarm_redis = yaml.safe_load(SWARM.read_text())["services"]["redis"]
    assert swarm_redis["command"][:2] == ["sh", "-c"] and "--aclfile /tmp/users.acl" in swarm_redis["command"][2]
    assert _shell_acl(swarm_redis["command"][2], credentials, tmp_path) == expected
    assert swarm_redis["secrets"] == ["redis-credentials"]
    container = _workloads()["redis"]["spec"]["template"]["spec"]["containers"][0]
    assert _shell_acl(container["command"][2], credentials, tmp_path) == expected


def test_swarm_turns_etcd_auth_on_and_only_daemons_hold_the_logins():
    swarm = yaml.safe_load(SWARM.read_text())
    services = swarm["services"]
    args = _enable_auth_args(services["etcd-auth"]["command"])
    assert args is not None and _parses_as_enable_auth(args)
    assert services["etcd-auth"]["deploy"]["restart_policy"]["condition"] == "on-failure"
    holders = {
        name: {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}
        for name, service in services.items()
    }
    assert {"etcd-credentials", "redis-credentials"} <= holders["faas-gpu"]
    for name in ("scheduler", "gpu-manager"):
        assert "etcd-credentials" in holders[name] and "redis-credentials" not in holders[name], name
    allowed = {"faas-gpu", "scheduler", "gpu-manager", "etcd-auth", "redis"}
    for name, held in holders.items():
        if held & set(DATASTORE_SECRETS):
            assert name in allowed, f"{name} is given a datastore login"
    assert all(swarm["secrets"][s] == {"external": True} for s in (*DATASTORE_SECRETS, "etcd-root-password"))


def test_kubernetes_turns_etcd_auth_on_with_a_job_and_mounts_the_logins_in_the_daemons_alone():
    jobs = {doc["metadata"]["name"]: doc for _, doc in _kubernetes_objects() if doc["kind"] == "Job"}
    container = jobs["etcd-auth"]["spec"]["template"]["spec"]["containers"][0]
    args = _enable_auth_args(container["args"])
    assert args is not None and _parses_as_enable_auth(args)
    for name, workload in _workloads().items():
        spec = workload["spec"]["template"]["spec"]
        sources = [
            source["secret"]
            for volume in spec.get("volumes", [])
            for source in volume.get("projected", {}).get("sources", [])
            if "secret" in source
        ]
        datastore = [s for s in sources if s["name"] == "faas-gpu-datastore"]
        if name in ("scheduler", "gpu-manager"):
            assert datastore and [i["key"] for i in datastore[0]["items"]] == ["etcd-credentials"], name
        elif name == "faas-gpu":
            assert datastore and "items" not in datastore[0]  # both logins
    example = {doc["metadata"]["name"]: doc for doc in _yaml_documents(KUBERNETES / "secrets.yaml.example")}
    assert set(example["faas-gpu-datastore"]["stringData"]) == set(DATASTORE_SECRETS)
    assert set(example["etcd-root"]["stringData"]) == {"root-password"}


def test_the_entry_point_copies_the_datastore_logins(tmp_path):
    out = _entrypoint(tmp_path, {"etcd-credentials": "faas-gpu:pw", "redis-credentials": "faas-gpu:pw2"}, "true")
    assert out.returncode == 0, out.stderr
    for name in DATASTORE_SECRETS:
        copied = tmp_path / "home" / "secrets" / name
        assert copied.read_text().startswith("faas-gpu:") and copied.stat().st_mode & 0o777 == 0o600
