"""`make gpu-wheels` (benchmarks/gpu_wheels.py): what travels to a GPU machine with no network, and
the embed model split in two halves that join back to the same bytes. The download itself needs
the package index and is not run here."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from faas_gpu.paths import REPO_ROOT
from tests.module_files import load


@pytest.fixture(scope="module")
def wheels():
    return load("gpu_wheels", REPO_ROOT / "benchmarks" / "gpu_wheels.py")


def test_the_stacks_libraries_travel_and_torch_and_the_images_compiled_packages_do_not(wheels):
    carry = wheels.to_carry()
    for needed in ("flask", "gunicorn", "redis", "etcd-sdk-python", "protobuf", "docker", "simpy", "pytest"):
        assert needed in carry, needed
    assert "opentelemetry-sdk" in carry and "werkzeug" in carry  # reached through what needs them
    assert not set(carry) & wheels.NOT_CARRIED
    assert not set(carry) & wheels.SKIPPED_EXTRAS  # the linters and browser tests are not the GPU suite's
    assert all(version for version in carry.values())  # pinned to what the tests here passed with


def test_the_embed_models_halves_join_to_the_packaged_file(wheels, tmp_path):
    try:
        wheels.embed_model_zip()
    except SystemExit as exc:
        pytest.skip(str(exc))
    wheels.split_embed(tmp_path)
    first, second = (tmp_path / "1" / "model.zip.part").read_bytes(), (tmp_path / "2" / "model.zip.part").read_bytes()
    assert abs(len(first) - len(second)) <= 1 and len(first) < 60 * 2**20  # each fits one call's carry
    joined = tmp_path / "model.zip"
    joined.write_bytes(first + second)
    digest = (tmp_path / "2" / "model.zip.sha256").read_text().split()[0]
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == digest
    checked = subprocess.run(["sha256sum", "-c", str(tmp_path / "2" / "model.zip.sha256")], cwd=tmp_path)
    assert checked.returncode == 0  # the command README gives for the device
    joined.write_bytes(second + first)  # halves joined in the wrong order are refused
    wrong = subprocess.run(
        ["sha256sum", "-c", str(tmp_path / "2" / "model.zip.sha256")], cwd=tmp_path, capture_output=True
    )
    assert wrong.returncode != 0
