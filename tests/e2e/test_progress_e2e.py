"""The first `faas-gpu invoke` of a function on the GPU path, at a terminal and in a pipe.

At a terminal (a pseudo-terminal as the CLI's stderr) the progress line names the cold start's
stages as the stack reports them (`faas_gpu.cli.progress`), in their order, and is wiped before
the answer; in a pipe the output is what it always was: the answer on stdout, nothing on stderr.
One state folder for the stack and its daemons, as `faas-gpu up` runs them.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading

import pytest

from faas_gpu.cli.progress import STAGES
from tests.daemon_process import Daemon
from tests.e2e.classify_project import add_function, build_and_deploy, classify_stack, write_project
from tests.stack_process import StackProcess

OTHER_HANDLER = """
import torch

from faas_gpu import remote

from .model import ResNetMini

torch.manual_seed(7)
model = remote(ResNetMini().eval())  # weights of its own: another model than classify's


def handle(event, context):
    return {"statusCode": 200, "body": {"shape": list(model(torch.zeros(1, 3, 32, 32)).shape)}}
"""


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress-e2e")
    home = root / ".faas-gpu"
    home.mkdir()
    stack_file = classify_stack("e2e/classify-progress:latest", {})
    add_function(root, stack_file, "other", OTHER_HANDLER, "e2e/other:latest")
    write_project(root, stack_file)
    # no warm worker: a load then spawns its process (~1-2 s here), long enough for the line's
    # half-second polls to see it; from the pool it takes ~0.1 s and can fall between two polls
    manager = Daemon(
        "gpu_manager", home, "--units", "1", "--unit-memory-mb", "64", "--node", "local", "--warm-workers", "0"
    )
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(home, "--scheduler", scheduler.url).start()
    build_and_deploy(root, home, stack.url)
    stack.wait_ready("classify", timeout_s=120)
    stack.wait_ready("other", timeout_s=120)
    stack.root = root
    yield stack
    stack.stop()
    scheduler.kill()
    manager.kill()


def invoke(stack, name: str, *flags: str, stderr=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", "invoke", name, "--gateway", stack.url, *flags],
        cwd=stack.root,
        env={**os.environ, "FAAS_GPU_HOME": str(stack.home)},
        input=b'{"seed": 0}',
        stdout=subprocess.PIPE,
        stderr=stderr,
        timeout=300,
    )


def test_a_terminal_sees_the_cold_start_stages_in_order(gpu_stack):
    main, tty = pty.openpty()
    seen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: the CLI exited and the terminal closed
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # a terminal's size, as a real one has
    try:
        done = invoke(gpu_stack, "classify", stderr=tty)
    finally:
        os.close(tty)
    reader.join(timeout=10)
    os.close(main)
    text = seen.decode(errors="replace")
    assert done.returncode == 0, text
    assert b'"label": "bird"' in done.stdout or b'"label":"bird"' in done.stdout, done.stdout
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip().startswith("classify: ")]
    keys = [_stage(ln) for ln in lines]
    assert keys, text
    order = [STAGES.index(k) for k in keys if k in STAGES]
    assert order == sorted(order), lines  # never backwards
    assert keys[-1] in ("loading", "loaded"), lines  # it saw the model reach a unit
    assert text.rstrip(" ").endswith("\r"), repr(text[-200:])  # the line wiped before the answer


def _stage(line: str) -> str:
    text = line.removeprefix("classify: ")
    for key, start in (
        ("replicas", "replicas ready"),
        ("exporting", "waiting; no model"),
        ("uploading", "uploading the model"),
        ("uploaded", "model uploaded"),
        ("copying", "sending the model"),
        ("loading", "loading the model"),
        ("loaded", "model loaded"),
    ):
        if start in text:
            return key
    return "other: " + text


def test_in_a_pipe_a_cold_start_prints_only_the_answer_as_before(gpu_stack):
    cold = invoke(gpu_stack, "other")
    warm = invoke(gpu_stack, "other", "--no-progress")
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr
    assert cold.stderr == b"" and warm.stderr == b""
    assert cold.stdout == warm.stdout and b'"shape"' in cold.stdout
