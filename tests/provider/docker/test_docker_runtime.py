"""The Docker runtime against a real dockerd: functions as containers of their images.

One engine and one stack (`--runtime docker`) for the module; each test deploys its own
functions. Images are built from the python3-gpu template's Dockerfile on that engine, with
the Debian-built base as BASE_IMAGE (nothing can be pulled here).
"""

from __future__ import annotations

import threading
import time

import pytest

from faas_gpu.ports import free_port
from provider.runtime.docker import owner_of

from .conftest import NsStack, build_project, containers

pytestmark = [pytest.mark.docker]

FUNCTIONS = {
    "echo": {"lang": "python3-gpu", "handler": "./echo", "image": "faas-gpu/echo:latest"},
    "hog": {"lang": "python3-gpu", "handler": "./hog", "image": "faas-gpu/hog:latest"},
}


@pytest.fixture(scope="module")
def host(docker_host):
    return docker_host


@pytest.fixture(scope="module")
def stack(host, tmp_path_factory):
    root = tmp_path_factory.mktemp("docker-project")
    build_project(host, root / "project", FUNCTIONS)
    # a scheduler address (nothing listens): replicas get the GPU env and their function's own token
    s = NsStack(host, root / "home", "--scheduler", "http://127.0.0.1:9")
    s.start()
    try:
        yield s
    finally:
        s.stop()
        left = host.client.containers.list(all=True, filters={"label": f"com.faas-gpu.owner={owner_of(s.home)}"})
        assert not left, f"the provider left containers behind: {[c.name for c in left]}"


def test_echo_runs_as_a_container_with_openfaas_labels_env_and_its_own_token(stack, host):
    stack.deploy(
        {
            "service": "echo",
            "image": "faas-gpu/echo:latest",
            "labels": {"team": "ml"},
            "annotations": {"topic": "demo"},
            "envVars": {"GREETING": "hi"},
            "limits": {"memory": "256Mi", "cpu": "500m"},
            "requests": {"memory": "64Mi"},
        }
    )
    stack.wait_ready("echo")
    r = stack.invoke("echo", b"hello containers", headers={"Content-Type": "text/plain"})
    assert r.status_code == 200 and r.text == "hello containers", r.text
    assert r.headers["X-Echo-Method"] == "POST"

    [c] = containers(host, "echo")
    labels = c.labels
    assert labels["com.openfaas.function"] == "echo" and labels["faas_function"] == "echo"
    assert labels["team"] == "ml" and labels["com.openfaas.annotations.topic"] == "demo"
    hc = c.attrs["HostConfig"]
    assert hc["NetworkMode"] == "host"
    assert hc["Memory"] == 256 * 1024 * 1024 and hc["MemorySwap"] == hc["Memory"]
    assert hc["MemoryReservation"] == 64 * 1024 * 1024 and hc["NanoCpus"] == 500_000_000
    assert hc["RestartPolicy"]["Name"] in ("", "no")  # the provider's supervisor restarts
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["GREETING"] == "hi" and env["FAAS_GPU_FUNCTION"] == "echo"
    assert env["FAAS_GPU_SCHEDULER_URL"].startswith("http://127.0.0.1:9")
    own = (stack.home / "secrets" / "function-tokens").rglob("*")
    tokens = {p.read_text().strip() for p in own if p.is_file()}
    # the function's own token, as a read-only file (never in the env a function may print) ...
    assert "FAAS_GPU_TOKEN" not in env and env["FAAS_GPU_TOKEN_FILE"] == "/var/openfaas/faas-gpu/token"
    token = c.exec_run(["cat", "/var/openfaas/faas-gpu/token"]).output.decode().strip()
    assert token in tokens and not any(t in "\n".join(env.values()) for t in tokens)
    cluster = stack.home / "secrets" / "gpu-manager-token"
    if cluster.exists():
        assert token != cluster.read_text().strip()  # ... never the cluster's
    # and nothing else of the host: no state folder, no daemon's credentials
    assert [(m["Destination"], m["RW"]) for m in c.attrs["Mounts"]] == [("/var/openfaas/faas-gpu", False)]
    assert not {"FAAS_GPU_HOME", "FAAS_GPU_ETCD", "FAAS_GPU_REDIS"} & set(env)
    assert env["port"] == labels["com.faas-gpu.port"]  # a port of its own on the host network


def test_secrets_are_read_only_files_at_var_openfaas_secrets(stack):
    r = stack.post("/system/secrets", json={"name": "api-key", "value": "s3cr3t-value"})
    assert r.status_code in (200, 202), r.text
    stack.deploy(
        {
            "service": "readsecret",
            "image": "faas-gpu/echo:latest",
            "envProcess": "cat /var/openfaas/secrets/api-key",
            "envVars": {"mode": "classic"},
            "secrets": ["api-key"],
        }
    )
    stack.deploy(
        {
            "service": "writesecret",
            "image": "faas-gpu/echo:latest",
            "envProcess": "sh -c 'echo x > /var/openfaas/secrets/api-key && echo wrote || echo refused'",
            "envVars": {"mode": "classic"},
            "secrets": ["api-key"],
        }
    )
    stack.wait_ready("readsecret")
    stack.wait_ready("writesecret")
    r = stack.invoke("readsecret")
    assert r.status_code == 200 and r.text == "s3cr3t-value", r.text
    r = stack.invoke("writesecret")
    assert "refused" in r.text and "wrote" not in r.text, r.text


def test_over_its_memory_limit_a_function_is_oom_killed_and_reported_the_stack_serves_on(stack, host):
    # 384Mi: room for the replica at rest (the base's GPU client imports torch), not for 1 GiB more
    stack.deploy({"service": "echo", "image": "faas-gpu/echo:latest"}, method="PUT")
    stack.deploy({"service": "hog", "image": "faas-gpu/hog:latest", "limits": {"memory": "384Mi"}})
    stack.wait_ready("hog")
    stack.wait_ready("echo")
    assert stack.invoke("hog", b"8").text == "held 8 MiB"
    r = stack.invoke("hog", b"1024")
    assert r.status_code >= 500, r.text

    def oom_state():
        s = stack.status("hog").get("faasGpuStatus") or {}
        return s if s.get("state") == "OOMKilled" else None

    state = stack.wait_until("describe says OOMKilled", oom_state, 30)
    assert "limits.memory 384Mi" in state["message"]
    texts = [m["text"] for m in stack.logs("hog")]
    assert any("OOM-killed" in t and "384Mi" in t for t in texts), texts[-10:]
    # the stack and the other functions are unharmed; the function itself is restarted
    assert stack.invoke("echo", b"still here").text == "still here"
    stack.wait_ready("hog")
    assert stack.invoke("hog", b"4").text == "held 4 MiB"
    # a redeploy with a bigger limit starts with a clean slate
    stack.deploy({"service": "hog", "image": "faas-gpu/hog:latest", "limits": {"memory": "1536Mi"}}, method="PUT")
    stack.wait_until("the new spec serves", lambda: stack.status("hog").get("faasGpuStatus") is None, 60)


def test_a_fork_over_the_limit_is_reported_while_its_container_serves_on(stack, host):
    """Classic mode: the fork is OOM-killed, the watchdog answers 500 and lives on; the engine's
    oom event still reaches describe and the logs."""
    stack.deploy(
        {
            "service": "cfork",
            "image": "faas-gpu/echo:latest",
            "envProcess": "python -c 'bytearray(1024 * 1024 * 1024)'",
            "envVars": {"mode": "classic"},
            "limits": {"memory": "128Mi"},
        }
    )
    stack.wait_ready("cfork")
    [before] = containers(host, "cfork")
    assert stack.invoke("cfork").status_code == 500

    def oom_state():
        s = stack.status("cfork").get("faasGpuStatus") or {}
        return s if s.get("state") == "OOMKilled" else None

    state = stack.wait_until("describe says OOMKilled", oom_state, 30)
    assert "limits.memory 128Mi" in state["message"] and "1 replica serving" in state["message"]
    assert [c.id for c in containers(host, "cfork")] == [before.id]  # not restarted: it serves on
    texts = [m["text"] for m in stack.logs("cfork")]
    assert sum("OOM-killed" in t for t in texts) == 1, texts[-10:]


def test_scale_up_and_down(stack, host):
    stack.deploy({"service": "scaled", "image": "faas-gpu/echo:latest"})
    stack.wait_ready("scaled")
    r = stack.post("/system/scale-function/scaled", json={"serviceName": "scaled", "replicas": 3})
    assert r.status_code == 202, r.text
    stack.wait_ready("scaled", replicas=3)
    assert len(containers(host, "scaled")) == 3
    ports = {c.labels["com.faas-gpu.port"] for c in containers(host, "scaled")}
    assert len(ports) == 3
    r = stack.post("/system/scale-function/scaled", json={"serviceName": "scaled", "replicas": 1})
    assert r.status_code == 202, r.text
    stack.wait_until("one container left", lambda: len(containers(host, "scaled")) == 1, 60)
    assert stack.invoke("scaled", b"x").text == "x"
    r = stack.request("DELETE", "/system/functions", json={"functionName": "scaled"})
    assert r.status_code == 202, r.text
    stack.wait_until("no container left", lambda: not containers(host, "scaled", running=False), 60)


def test_rolling_update_serves_throughout(stack, host):
    # one replica, whatever the load: CE's alert rule would scale this loop's load up meanwhile
    one = {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "1"}
    stack.deploy({"service": "rolling", "image": "faas-gpu/echo:latest", "envVars": {"VERSION": "1"}, "labels": one})
    stack.wait_ready("rolling")
    [old] = containers(host, "rolling")
    failures: list = []
    stop = threading.Event()

    def load():
        while not stop.is_set():
            r = stack.invoke("rolling", b"ping")
            if r.status_code != 200 or r.text != "ping":
                failures.append((r.status_code, r.text[:200]))

    t = threading.Thread(target=load)
    t.start()
    try:
        stack.deploy(
            {"service": "rolling", "image": "faas-gpu/echo:latest", "envVars": {"VERSION": "2"}, "labels": one}, "PUT"
        )

        def rolled():
            cs = containers(host, "rolling")
            return len(cs) == 1 and cs[0].id != old.id

        stack.wait_until("the old container replaced", rolled, 120)
        time.sleep(0.5)
    finally:
        stop.set()
        t.join()
    assert not failures, failures[:5]
    [new] = containers(host, "rolling")
    assert "VERSION=2" in new.attrs["Config"]["Env"]


def test_a_crashing_function_is_restarted_with_backoff_then_reported_crash_looping(stack, host):
    stack.deploy(
        {"service": "crasher", "image": "faas-gpu/echo:latest", "envProcess": "python -c 'import sys; sys.exit(3)'"}
    )

    def crash_looping():
        s = stack.status("crasher").get("faasGpuStatus") or {}
        return s if s.get("state") == "CrashLooping" else None

    state = stack.wait_until("CrashLooping", crash_looping, 60)
    assert "crasher" in state["message"]
    r = stack.invoke("crasher", b"x")
    assert r.status_code == 503 and "crash-looping" in r.text, (r.status_code, r.text)
    texts = [m["text"] for m in stack.logs("crasher")]
    assert sum("exited with code" in t for t in texts) >= 3, texts[-10:]
    r = stack.request("DELETE", "/system/functions", json={"functionName": "crasher"})
    assert r.status_code == 202
    stack.wait_until("no container left", lambda: not containers(host, "crasher", running=False), 60)


def test_logs_come_from_the_engine(stack):
    stack.deploy({"service": "echo", "image": "faas-gpu/echo:latest"}, method="PUT")
    stack.wait_ready("echo")
    stack.invoke("echo", b"log me")
    texts = stack.wait_until(
        "the watchdog's lines in /system/logs",
        lambda: [m for m in stack.logs("echo") if "Listening on port" in m["text"]],
        30,
    )
    assert texts[0]["instance"].startswith("echo-") and texts[0]["namespace"] == "openfaas-fn"


def test_system_info_says_the_docker_engine_runs_the_functions(stack):
    info = stack.request("GET", "/system/info").json()
    assert info["provider"]["orchestration"] == "docker", info


def test_unknown_image_is_refused_at_deploy(stack):
    r = stack.request("POST", "/system/functions", json={"service": "nothere", "image": "faas-gpu/nothere:latest"})
    assert r.status_code == 400 and "not in the Docker engine" in r.text, r.text


def test_an_infless_plan_runs_one_container_per_instance_with_its_own_env(stack, host, tmp_path):
    """The runtime itself (built in the host's namespace: its supervisor probes replicas there)."""
    from provider.logs import LogStore
    from provider.runtime.base import InstanceSpec
    from provider.runtime.docker import DockerRuntime
    from provider.store import SecretStore
    from provider.types import FunctionDeployment, FunctionRecord

    rt = host.call(
        DockerRuntime, tmp_path / "home", SecretStore(tmp_path / "sec"), LogStore(tmp_path / "logs"),
        docker_host=host.base_url,
    )  # fmt: skip
    try:
        rec = FunctionRecord(FunctionDeployment.from_json({"service": "planned", "image": "faas-gpu/echo:latest"}),
                             "openfaas-fn", 1)  # fmt: skip
        plan = [InstanceSpec("a", {"FAAS_GPU_MAX_BATCH": "2"}), InstanceSpec("b", {"FAAS_GPU_MAX_BATCH": "4"})]
        rt.set_plan("openfaas-fn", "planned", plan)
        rt.apply(rec)

        def slots() -> dict[str, dict]:
            out = {}
            for c in containers(host, "planned"):
                out[c.labels["com.faas-gpu.slot"]] = {"id": c.id, "env": c.attrs["Config"]["Env"]}
            return out

        stack.wait_until("two ready instances", lambda: len(rt.ready_instances("openfaas-fn", "planned")) == 2, 60)
        first = slots()
        assert "FAAS_GPU_MAX_BATCH=2" in first["a"]["env"] and "FAAS_GPU_MAX_BATCH=4" in first["b"]["env"]
        assert {i for i, _ in rt.ready_instances("openfaas-fn", "planned")} == {"a", "b"}
        # a re-plan that changes b alone replaces b's container and keeps a's
        rt.set_plan("openfaas-fn", "planned", [plan[0], InstanceSpec("b", {"FAAS_GPU_MAX_BATCH": "8"})])

        def replanned():
            now = slots()
            return set(now) == {"a", "b"} and "FAAS_GPU_MAX_BATCH=8" in now["b"]["env"] and now

        now = stack.wait_until("b re-planned", replanned, 60)
        assert now["a"]["id"] == first["a"]["id"]
    finally:
        rt.close()
    assert not containers(host, "planned", running=False)


def test_faas_gpu_build_docker_push_reaches_a_registry(stack, host, tmp_path):
    """`faas-gpu build --docker --push`: the template built with the engine, pushed to the
    registry the image's name says (a docker-registry in the host's namespace)."""
    import shutil
    import subprocess
    import sys

    import requests

    if shutil.which("docker-registry") is None:
        pytest.skip("needs docker-registry (Debian: make servers)")
    port = free_port()
    (tmp_path / "registry.yml").write_text(
        f"version: 0.1\nstorage: {{filesystem: {{rootdirectory: {tmp_path / 'data'}}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
    )
    registry = host.popen(["docker-registry", "serve", str(tmp_path / "registry.yml")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        host.wait_port("127.0.0.1", port)
        project = tmp_path / "project"
        image = f"127.0.0.1:{port}/faas-gpu/echo:latest"  # 127.0.0.0/8: a registry the engine trusts
        build_project(host, project, {"echo": {"lang": "python3-gpu", "handler": "./echo", "image": image}})
        done = host.run(
            [sys.executable, "-m", "faas_gpu.cli", "build", "--docker", "--push", "--docker-host", host.base_url,
             "-f", "stack.yml", "--build-arg", "BASE_IMAGE=faas-gpu/base:latest"],
            check=False, cwd=project,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Pushed: {image}" in done.stdout
        catalog = host.call(requests.get, f"http://127.0.0.1:{port}/v2/_catalog", timeout=10).json()
        assert "faas-gpu/echo" in catalog["repositories"]
    finally:
        registry.kill()
        registry.wait()


def test_a_restarted_provider_removes_what_a_killed_one_left_and_starts_the_functions_again(stack, host, tmp_path):
    import signal

    other = NsStack(host, tmp_path / "home").start()
    try:
        other.deploy({"service": "survivor", "image": "faas-gpu/echo:latest"})
        other.wait_ready("survivor")
        [orphan] = containers(host, "survivor")
        other.stop(signal.SIGKILL)  # no close(): its container is left running
        assert [c.id for c in containers(host, "survivor")] == [orphan.id]
        other.start()
        other.wait_ready("survivor")
        [fresh] = containers(host, "survivor", running=False)
        assert fresh.id != orphan.id
        assert other.invoke("survivor", b"back").text == "back"
    finally:
        other.stop()
    assert not containers(host, "survivor", running=False)
