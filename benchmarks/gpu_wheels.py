"""`make gpu-wheels`: the wheels `make gpu-check` needs on a GPU machine that has no network.

The H200 machines this project is lent have an image with Python 3.12, torch built for CUDA, the
scientific stack and pytest, but none of the stack's own services' libraries (flask, gunicorn,
redis, etcd's client, docker, OpenTelemetry...), and nothing can be fetched there. Installing
`pyproject.toml` there is impossible, and torch could not travel anyway (its CUDA wheels are
gigabytes). So the GPU suite runs on the image's python and torch, with the stack's other
dependencies carried as wheels: this downloads them into `.whl/` (git-ignored) for CPython 3.12 on
manylinux x86-64, at the versions installed in this checkout's venv (the ones the tests passed
with). README, "The GPU suite", gives the command to run there.

What is carried: the project's runtime dependencies and what they need, walked through the
installed packages' metadata, less torch and less the compiled packages the image holds (their
wheels are large and the image's builds match its python). Pure-python packages the image may
also hold travel anyway: the versions tested here then win, because the carried folder comes
first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import importlib.util
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from faas_gpu.paths import REPO_ROOT

PROJECT = "faas-gpu"
EXTRAS = ("test",)  # pytest and its plugins: the suite runs `pytest -m gpu tests/gpu`
NOT_CARRIED = {
    # the image's own torch (CUDA) is the one to run
    "torch",
    # compiled, and in the image (device README, KINDS.md: "Python packages already there")
    "numpy",
    "matplotlib",
    "contourpy",
    "fonttools",
    "kiwisolver",
    "pillow",
    "grpcio",
    "markupsafe",
    "pyyaml",
    "charset-normalizer",
}
"""Never carried. Test-only tools the GPU suite does not run are left out by `SKIPPED_EXTRAS`."""
SKIPPED_EXTRAS = {"ruff", "import-linter", "selenium", "kubernetes-validate", "check-jsonschema", "hypothesis"}
TARGET = {  # the device image's interpreter and platform
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _applies(req: Requirement, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({**TARGET, "extra": extra})


def to_carry() -> dict[str, str]:
    """{distribution name: installed version} of what travels, walked from the project's metadata."""
    wanted: list[str] = []
    for spec in md.requires(PROJECT) or []:
        req = Requirement(spec)
        if canonicalize_name(req.name) in SKIPPED_EXTRAS:
            continue
        if _applies(req) or any(_applies(req, extra) for extra in EXTRAS):
            wanted.append(req.name)
    found: dict[str, str] = {}
    while wanted:
        name = canonicalize_name(wanted.pop())
        if name in found or name in NOT_CARRIED:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"gpu-wheels: {name} is not installed here (run make first)") from None
        found[name] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if _applies(req):
                wanted.append(req.name)
    return dict(sorted(found.items()))


def embed_model_zip() -> Path:
    """The embed example's model.zip, found as the function finds it (`functions/embed/model.py`)."""
    spec = importlib.util.spec_from_file_location(
        "gpu_wheels_embed_model", REPO_ROOT / "functions" / "embed" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    try:
        return embed.package_zip()
    except embed.PackageMissing as exc:
        raise SystemExit(f"gpu-wheels: {exc}") from None


def split_embed(dest: Path) -> str:
    """model.zip in two halves under dest/1 and dest/2, and dest/2/model.zip.sha256."""
    data = embed_model_zip().read_bytes()
    half = len(data) // 2
    for part, chunk in (("1", data[:half]), ("2", data[half:])):
        (dest / part).mkdir(parents=True, exist_ok=True)
        (dest / part / "model.zip.part").write_bytes(chunk)
    digest = hashlib.sha256(data).hexdigest()
    (dest / "2" / "model.zip.sha256").write_text(f"{digest}  model.zip\n")  # sha256sum -c's format
    return f"{len(data) / 2**20:.1f} MiB in two halves under {dest}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dest", type=Path, default=Path(".whl"), help="folder for the wheels (default .whl)")
    p.add_argument("--python-version", default=TARGET["python_version"], help="the device's Python (default 3.12)")
    p.add_argument("--with-embed", action="store_true", help="also the embed model, split for two calls")
    p.add_argument("--embed-dest", type=Path, default=Path(".whl-embed"), help="its folder (default .whl-embed)")
    args = p.parse_args()
    carry = to_carry()
    args.dest.mkdir(parents=True, exist_ok=True)
    for old in args.dest.glob("*.whl"):
        old.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", args.python_version, "--implementation", "cp", "-d", str(args.dest)]
    cmd += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    cmd += [f"{name}=={version}" for name, version in carry.items()]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        return done.returncode
    got = {parse_wheel_filename(w.name)[0] for w in args.dest.glob("*.whl")}
    missing = sorted(set(carry) - got)
    if missing:
        print(f"gpu-wheels: no wheel came for {', '.join(missing)}", file=sys.stderr)
        return 1
    size = sum(w.stat().st_size for w in args.dest.glob("*.whl"))
    print(f"gpu-wheels: {len(carry)} wheels, {size / 2**20:.1f} MiB in {args.dest}: {', '.join(carry)}")
    if args.with_embed:
        print(f"gpu-wheels: the embed model, {split_embed(args.embed_dest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
