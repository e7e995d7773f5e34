"""The test hosts themselves (tests/docker_hosts.py): a real dockerd per network namespace, the
base image built from Debian packages, a three-host Swarm with a registry. The runtimes' tests
stand on these, so when one of them fails here, look here first."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import pytest
import requests

from faas_gpu import base_image
from tests.docker_hosts import REGISTRY, DockerHost, Swarm

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]  # a cold cache builds python-deps first


def wait_for(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def test_base_image_runs_torch_and_faas_gpu(docker_host: DockerHost):
    out = docker_host.client.containers.run(
        base_image.BASE_IMAGE,
        ["python", "-c", "import torch, faas_gpu, provider, scheduler, gpu_manager, procurer\n"
         "from faas_gpu import paths\n"
         "assert (paths.TEMPLATES_DIR / 'python3-gpu' / 'Dockerfile').is_file(), paths.TEMPLATES_DIR\n"
         "print(torch.__version__, paths.REPO_ROOT)"],
        network_mode="host", remove=True,
    )  # fmt: skip
    assert out.decode().split() == ["2.13.0+cpu", base_image.SOURCE_DIR]


def test_container_answers_http_through_call(docker_host: DockerHost):
    container = docker_host.client.containers.run(
        base_image.BASE_IMAGE, ["python", "-m", "http.server", "18080", "--bind", "127.0.0.1"],
        network_mode="host", detach=True,
    )  # fmt: skip
    try:
        docker_host.wait_port("127.0.0.1", 18080)
        resp = docker_host.call(requests.get, "http://127.0.0.1:18080/", timeout=5)
        assert resp.status_code == 200
    finally:
        container.remove(force=True)


def _service(swarm: Swarm, name: str, replicas: int = 4):
    return swarm.manager.client.services.create(
        base_image.BASE_IMAGE, ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
        name=name, mode={"Replicated": {"Replicas": replicas}}, constraints=["node.labels.gpu==true"],
        networks=["host"],
    )  # fmt: skip


def test_swarm_spreads_replicas_across_gpu_workers(swarm3: Swarm):
    nodes = {n.attrs["Description"]["Hostname"]: n.attrs for n in swarm3.manager.client.nodes.list()}
    assert sorted(nodes) == ["manager", "worker1", "worker2"]
    assert nodes["worker1"]["Spec"]["Labels"] == {"gpu": "true"}
    service = _service(swarm3, "spread")
    try:
        wait_for(lambda: sum(swarm3.tasks_by_host(service).values()) == 4, 120, "4 running replicas")
        assert swarm3.tasks_by_host(service) == {"worker1": 2, "worker2": 2}
    finally:
        service.remove()


def test_worker_pulls_from_the_managers_registry(swarm3: Swarm):
    manager, worker = swarm3.manager, swarm3.workers[0]
    dockerfile = io.BytesIO(f"FROM {base_image.BASE_IMAGE}\nRUN echo pulled > /hello\n".encode())
    manager.client.images.build(fileobj=dockerfile, tag="h1-tiny:1", network_mode="none", rm=True)
    name = swarm3.push("h1-tiny:1")
    assert name == f"{REGISTRY}/h1-tiny:1"
    worker.client.images.pull(name)
    out = worker.client.containers.run(name, ["cat", "/hello"], network_mode="host", remove=True)
    assert out == b"pulled\n"
    assert swarm3.base_image == f"{REGISTRY}/{base_image.BASE_IMAGE}"  # type: ignore[attr-defined]


def test_cut_host_tasks_are_rescheduled(swarm3: Swarm):
    lost, kept = swarm3.workers[1], swarm3.workers[0]
    service = _service(swarm3, "resched")
    try:
        wait_for(lambda: swarm3.tasks_by_host(service) == {"worker1": 2, "worker2": 2}, 120, "2 + 2 replicas")
        swarm3.switch.cut(lost)
        try:
            wait_for(lambda: swarm3.tasks_by_host(service) == {kept.name: 4}, 90, f"4 replicas on {kept.name}")
            assert swarm3.node(lost).attrs["Status"]["State"] == "down"
        finally:
            swarm3.switch.restore(lost)
        wait_for(lambda: swarm3.node(lost).attrs["Status"]["State"] == "ready", 60, f"{lost.name} back")
    finally:
        service.remove()
