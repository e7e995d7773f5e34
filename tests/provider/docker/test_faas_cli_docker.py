"""The real faas-cli against the Docker runtime: `faas-cli build` (a `docker build` of the python3-gpu
template's Dockerfile, BASE_IMAGE as a build argument) then `faas-cli deploy`, `invoke`, `logs`.

faas-cli does not ship through a package registry, so this runs only where a binary is given
(`FAAS_CLI=/path/to/faas-cli`, as tests/provider/test_openfaas_interop.py); it skips otherwise.
Checked with a faas-cli built from source (Debian's Go 1.19 builds 0.16.x offline from its vendor/
folder; 0.17+ write `stack.yaml` where 0.16 wrote `<name>.yml`: both are handled).
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from .conftest import BASE_IMAGE, NsStack, containers

FAAS_CLI = os.environ.get("FAAS_CLI")

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not FAAS_CLI, reason="set FAAS_CLI to a faas-cli binary"),
]


@pytest.mark.timeout(1800)
def test_real_faas_cli_builds_the_template_with_docker_and_deploys_a_container(docker_host, tmp_path):
    host = docker_host
    project = tmp_path / "project"
    project.mkdir()
    stack = NsStack(host, tmp_path / "home").start()
    # faas-cli's docker builds go to the test host's engine; its config stays in the test's folder
    env = {
        **os.environ,
        **host.env(),
        "OPENFAAS_CONFIG": str(tmp_path / "faas-cli"),
        "FAAS_GPU_HOME": str(stack.home),
    }
    env.pop("CI", None)  # with CI=true faas-cli reads ./.openfaas instead of OPENFAAS_CONFIG
    env.pop("OPENFAAS_URL", None)
    gateway = ["-g", stack.url]

    def run(*argv: str, input: str | None = None) -> str:  # noqa: A002
        cmd = [FAAS_CLI, *argv] if argv[0] != "faas-gpu" else [sys.executable, "-m", "faas_gpu.cli", *argv[1:]]
        given = {"input": input, "stdin": None} if input is not None else {}
        done = host.run(cmd, env=env, cwd=project, check=False, timeout=600, **given)
        assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    try:
        run("faas-gpu", "template", "pull")
        run("new", "myfn", "--lang", "python3-gpu")
        stack_file = next(p for p in ("stack.yaml", "stack.yml", "myfn.yml") if (project / p).is_file())
        built = run("build", "-f", stack_file, "--build-arg", f"BASE_IMAGE={BASE_IMAGE}")
        assert "myfn:latest" in built and host.client.images.get("myfn:latest")
        run("login", *gateway, "-u", "admin", "--password-stdin", input=stack.auth[1])
        run("deploy", "-f", stack_file, *gateway)
        deadline = time.monotonic() + 120
        while "Available Replicas: 1" not in " ".join(run("describe", "myfn", *gateway).split()):
            assert time.monotonic() < deadline, stack.log_tail()
            time.sleep(1)
        assert [c.image.tags for c in containers(host, "myfn")] == [["myfn:latest"]]
        assert "Hello from python3-gpu" in run("invoke", "myfn", *gateway, input="hi")
        assert "Listening on port" in run("logs", "myfn", *gateway, "--tail=false", "--lines=20")
        run("remove", "myfn", *gateway)
        stack.wait_until("myfn's container removed", lambda: not containers(host, "myfn", running=False))
    finally:
        stack.stop()
