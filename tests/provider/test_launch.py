"""How a function's record becomes a process replica's command line (provider/runtime/launch.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from faas_gpu.imagestore import ImageRecord
from faas_gpu.paths import TEMPLATES_DIR
from provider.runtime.launch import dockerfile_env, plan_launch
from provider.store import SecretStore
from provider.types import FunctionDeployment, FunctionRecord


class OneImage:
    def __init__(self, record: ImageRecord):
        self.record = record

    def get(self, image: str) -> ImageRecord | None:
        return self.record if image == self.record.image else None


def _image(tmp_path: Path, dockerfile: str | None, python: bool = True) -> ImageRecord:
    folder = tmp_path / "img"
    context = folder / "context"
    context.mkdir(parents=True)
    if dockerfile is not None:
        (context / "Dockerfile").write_text(dockerfile)
    venv_python = folder / "venv" / "bin" / "python"
    if python:
        venv_python.parent.mkdir(parents=True)
        venv_python.symlink_to(sys.executable)
    return ImageRecord("fn:latest", folder, context, venv_python, "python index.py", "python3-gpu", 1.0)


def _plan(tmp_path: Path, image: ImageRecord, **deployment):
    record = FunctionRecord(FunctionDeployment(service="fn", image="fn:latest", **deployment), "openfaas-fn", 1)
    return plan_launch(record, images=OneImage(image), secrets=SecretStore(tmp_path / "secrets"), gpu_env={})


def test_the_python3_gpu_template_runs_its_handler_in_the_watchdogs_process():
    assert dockerfile_env(TEMPLATES_DIR / "python3-gpu" / "Dockerfile")["mode"] == "inproc"


def test_a_process_replica_gets_its_images_readiness_check(tmp_path):
    """python3-gpu's Dockerfile names its readiness check (`ready_path`, of-watchdog's): a process
    replica gets it as a container of the image would, unless the function sets its own."""
    image = _image(tmp_path, (TEMPLATES_DIR / "python3-gpu" / "Dockerfile").read_text())
    assert _plan(tmp_path, image).env["ready_path"] == "/_/ready"
    assert _plan(tmp_path, image, envVars={"ready_path": "/mine"}).env["ready_path"] == "/mine"


def test_dockerfile_env_reads_both_forms_and_continued_lines(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(
        'FROM x\nENV a="one two" \\\n    b=2\nenv legacy value with spaces\nRUN echo ENV c=3\nENV d=4 # note\n'
    )
    assert dockerfile_env(path) == {"a": "one two", "b": "2", "legacy": "value with spaces", "d": "4"}
    assert dockerfile_env(tmp_path / "missing") == {}


def test_a_process_replica_gets_its_images_mode_unless_the_function_sets_one(tmp_path):
    image = _image(tmp_path, 'FROM x\nENV fprocess="python index.py" \\\n    mode="inproc" \\\n    port=8080\n')
    spec = _plan(tmp_path, image)
    assert spec.env["mode"] == "inproc" and not spec.http_mode
    assert spec.argv[0] == str(image.python)  # the function's environment: inproc imports its code
    spec = _plan(tmp_path, image, envVars={"mode": "http"})
    assert spec.env["mode"] == "http" and spec.http_mode


def test_an_image_built_before_inproc_keeps_http_mode(tmp_path):
    spec = _plan(tmp_path, _image(tmp_path, None, python=False))
    assert spec.env["mode"] == "http" and spec.http_mode and spec.argv[0] == sys.executable


def test_a_max_batch_the_user_wrote_is_a_ceiling_the_batch_bound_does_not_grow():
    """`com.faas-gpu.max-batch: "1"` means batches of one: the instance's batch bound (which grows a
    planned batch under a load the plan did not foresee) is off for it; without it the bound stays."""
    from provider.runtime.launch import gpu_settings

    capped = gpu_settings({"com.faas-gpu.max-batch": "1", "com.faas-gpu.slo-ms": "250"})
    assert capped["FAAS_GPU_MAX_BATCH"] == "1" and capped["FAAS_GPU_BATCH_BOUND"] == "off"
    assert "FAAS_GPU_BATCH_BOUND" not in gpu_settings({"com.faas-gpu.slo-ms": "250"})
