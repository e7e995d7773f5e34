"""Run OpenFaaS's certifier against `faas-gpu up --runtime docker`, on a dockerd of its own.

Why this exists: the certifier is OpenFaaS's conformance suite for providers, and its image tests
(Invoke, SecretCRUD, logs, scaling) need a runtime that runs images. No registry is reachable
here, so the images it deploys are stand-ins built locally (`standins/`: `functions/alpine` runs
the classic watchdog with the deployment's fprocess; `theaxer/redirector` is the certifier's own
functions/redirector/handler.go compiled with a golang-middleware-like main, behind the watchdog
in http mode), each on faas-gpu/base (Debian-built, `faas-gpu base-image`).

Nothing leaves a network namespace of our own: a test host (`tests.docker_hosts.DockerHost`:
`unshare --net`, its own dockerd with `--bridge=none --iptables=false`, data root, exec root and
socket) holds the engine, the stack (gateway 8080, provider 8081 inside the namespace) and the
certifier's test binary. The machine's own dockerd and network are never touched.

Usage (run_docker.sh builds the certifier's test binary and calls this):
    .venv/bin/python -m tests.certifier.run_docker --certifier-src DIR --certifier-bin FILE [--out DIR]
        [--run REGEX] [--namespace certifier-test] [--no-gpu]
Exit status: the certifier's. A summary (one line per test: PASS/FAIL/SKIP) is printed and
written with the full output under --out.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from faas_gpu import base_image
from faas_gpu.paths import REPO_ROOT
from tests.docker_hosts import DockerHost

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "standins"
WATCHDOG = REPO_ROOT / "templates" / "python3-gpu"
GATEWAY = "http://127.0.0.1:8080"
ALPINE = ("functions/alpine:latest",)
REDIRECTOR = ("theaxer/redirector:latest",)
DEFAULT_NAMESPACE = "openfaas-fn"
RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+)")


def log(message: str) -> None:
    print(f"[certify-docker] {message}", file=sys.stderr, flush=True)


def _context(folder: Path, dockerfile: Path) -> None:
    """A build context: the Dockerfile and the watchdog (fwatchdog.py and its package)."""
    shutil.copy(dockerfile, folder / "Dockerfile")
    shutil.copy(WATCHDOG / "fwatchdog.py", folder / "fwatchdog.py")
    shutil.copytree(WATCHDOG / "faas_gpu_watchdog", folder / "faas_gpu_watchdog",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip


def build_redirector_binary(certifier_src: Path, target: Path) -> None:
    """`./handler`: the certifier's redirector handler with standins/redirector/main.go, static."""
    with tempfile.TemporaryDirectory(prefix="redirector-") as work:
        src = Path(work)
        shutil.copy(STANDINS / "redirector" / "main.go", src / "main.go")
        shutil.copy(STANDINS / "redirector" / "go.mod", src / "go.mod")
        (src / "function").mkdir()
        shutil.copy(certifier_src / "functions" / "redirector" / "handler.go", src / "function" / "handler.go")
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", "GOPROXY": "off",
               "GOCACHE": os.environ.get("GOCACHE", str(Path(work) / "cache"))}  # fmt: skip
        subprocess.run(["go", "build", "-o", str(target), "."], cwd=src, env=env, check=True)


def build_standins(client, certifier_src: Path) -> None:
    """Build and tag the images the certifier deploys (no network inside the builds)."""
    for name, tags in (("alpine", ALPINE), ("redirector", REDIRECTOR)):
        with tempfile.TemporaryDirectory(prefix=f"standin-{name}-") as work:
            folder = Path(work)
            _context(folder, STANDINS / name / "Dockerfile")
            if name == "redirector":
                build_redirector_binary(certifier_src, folder / "handler")
            start = time.monotonic()
            image, _ = client.images.build(path=str(folder), tag=tags[0], rm=True, forcerm=True,
                                           network_mode="none",
                                           buildargs={"BASE_IMAGE": base_image.BASE_IMAGE})  # fmt: skip
            for tag in tags[1:]:
                repo, _, version = tag.rpartition(":")
                image.tag(repo, version)
            log(f"built {', '.join(tags)} ({time.monotonic() - start:.1f} s)")


def write_faas_cli_config(folder: Path, home: Path) -> None:
    """faas-cli's config.yml with the stack's basic auth, as `faas-cli login` writes it: the
    certifier's -enableAuth reads it (OPENFAAS_CONFIG names the folder)."""
    secrets = home / "secrets"
    user = (secrets / "basic-auth-user").read_text().strip()
    password = (secrets / "basic-auth-password").read_text().strip()
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    folder.mkdir(parents=True, exist_ok=True)
    config = {"auths": [{"gateway": GATEWAY, "auth": "basic", "token": token}]}
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    (folder / "config.yml").chmod(0o600)


def summarize(output: str) -> list[tuple[str, str]]:
    """(result, test) for every `--- PASS/FAIL/SKIP` line of `go test -v` output."""
    return [(m.group(1), m.group(2)) for m in map(RESULT.match, output.splitlines()) if m]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    faas_gpu = Path(sys.executable).parent / "faas-gpu"
    host = DockerHost("certify")
    home = Path(tempfile.mkdtemp(prefix="certify-home-"))
    # FAAS_GPU_CONFIG: the stack's record stays in its own folder, never the user's ~/.config
    env = {**os.environ, "FAAS_GPU_HOME": str(home), "FAAS_GPU_RUNTIME": "docker",
           "FAAS_GPU_DOCKER_HOST": host.base_url, "OPENFAAS_CONFIG": str(home / "faas-cli"),
           "FAAS_GPU_CONFIG": str(home / "config.yml")}  # fmt: skip
    env.pop("CI", None)  # faas-cli: CI=true reads ./.openfaas instead of OPENFAAS_CONFIG
    try:
        result = base_image.build(host.client, log=log)
        log(f"base image {result.base} ({', '.join(f'{k} {v:.0f} s' for k, v in result.timings.items())})")
        build_standins(host.client, Path(args.certifier_src))
        up = [str(faas_gpu), "up", "--runtime", "docker", "--docker-host", host.base_url, "--no-deploy"]
        if args.no_gpu:
            up.append("--no-gpu")
        if args.namespace:  # as the certifier's `make test-kubernetes` (CERTIFIER_NAMESPACES=certifier-test)
            up += ["--namespace", DEFAULT_NAMESPACE, "--namespace", args.namespace]
            env["CERTIFIER_NAMESPACES"] = args.namespace
        started = host.run(up, env=env, cwd=home, check=False)
        log(started.stdout + started.stderr)
        if started.returncode != 0:
            raise RuntimeError(f"faas-gpu up failed ({started.returncode})")
        write_faas_cli_config(home / "faas-cli", home)
        argv = [str(Path(args.certifier_bin).resolve()), "-test.v", "-test.count=1", "-test.timeout=30m",
                f"-gateway={GATEWAY}", "-enableAuth"]  # fmt: skip
        if args.run:
            argv.append(f"-test.run={args.run}")
        log("certifier: " + " ".join(argv))
        start = time.monotonic()
        # cwd: the certifier's tests folder, as `go test ./tests` runs it
        with open(out / "certifier.log", "wb") as certifier_log:  # followed while it runs: tail -f
            done = host.popen(argv, env=env, cwd=Path(args.certifier_src) / "tests", stdout=certifier_log,
                              stderr=subprocess.STDOUT)  # fmt: skip
            done.wait()
        output = (out / "certifier.log").read_text(errors="replace")
        results = summarize(output)
        lines = [f"{result} {test}" for result, test in results]
        (out / "summary.txt").write_text("\n".join(lines) + "\n")
        print(output[-4000:] if args.quiet else output)
        print("\n".join(lines))
        counts = {k: sum(1 for r, _ in results if r == k) for k in ("PASS", "FAIL", "SKIP")}
        log(f"certifier exit {done.returncode} in {time.monotonic() - start:.0f} s: {counts}; {out}/certifier.log")
        return done.returncode
    finally:
        with open(out / "stack-logs.txt", "w") as logs_out:
            for path in sorted(home.glob("*.log")):
                logs_out.write(f"==== {path.name}\n{path.read_text(errors='replace')[-20000:]}\n")
        host.run([str(faas_gpu), "down"], env=env, cwd=home, check=False)
        host.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--certifier-src", required=True, help="the certifier's source tree (functions/, tests/)")
    p.add_argument("--certifier-bin", required=True, help="its test binary (go test -c ./tests)")
    p.add_argument("--out", default="out/certifier-docker", help="where the log and summary go")
    p.add_argument("--run", help="only tests matching this regexp (go test -run)")
    p.add_argument("--no-gpu", action="store_true", help="`faas-gpu up --no-gpu`: no GPU Manager or scheduler")
    p.add_argument("--namespace", help="a second namespace the certifier also deploys to (CERTIFIER_NAMESPACES)")
    p.add_argument("--keep", action="store_true", help="keep the stack's state folder")
    p.add_argument("--quiet", action="store_true", help="print only the end of the certifier's output")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
