"""The CLI's progress line (`faas_gpu.cli.progress`): the stage a function's first call waits
for, read from the gateway's status JSON, shown on a terminal and nowhere else."""

from __future__ import annotations

import io
import threading

from faas_gpu.cli.progress import STAGES, Progress, Stage, stage_of

KEY = "classify.openfaas-fn"
DIGEST = "d" * 64


class FakeTerminal(io.StringIO):
    """What tqdm writes, kept; says it is a terminal (tqdm's disable=None then draws)."""

    def isatty(self) -> bool:
        return True


def status(replicas: int = 1, uploading=None, models=None, units=None) -> dict:
    return {
        "functions": {
            "items": [{"name": "classify", "namespace": "openfaas-fn", "replicas": 1, "availableReplicas": replicas}]
        },
        "units": units or [],
        "scheduler": {"configured": True, "uploading": uploading or [], "models": models or []},
    }


def unit(running: bool, cached: bool) -> dict:
    model = {"digest": DIGEST, "functions": [KEY]}
    return {
        "key": "local/cpu-1",
        "running": model if running else None,
        "models": [model] if cached else [],
        "busyForS": 2.4,
    }


COLD_START = [  # the status JSON at each stage of a real cold start, in order
    status(replicas=0),
    status(),
    status(uploading=[{"function": KEY, "bytes": 3 * 2**20, "total": 8 * 2**20, "seconds": 0.5}]),
    status(models=[{"digest": DIGEST, "functions": [KEY], "state": "uploaded", "size": 8 * 2**20}]),
    status(models=[{"digest": DIGEST, "functions": [KEY], "state": "copying", "unit": "local/cpu-1"}]),
    status(
        models=[{"digest": DIGEST, "functions": [KEY], "state": "copying", "unit": "local/cpu-1"}],
        units=[unit(running=True, cached=False)],
    ),
    status(
        models=[{"digest": DIGEST, "functions": [KEY], "state": "loaded", "unit": "local/cpu-1", "loadS": 2.5}],
        units=[unit(running=False, cached=True)],
    ),
]


def test_each_stage_of_a_cold_start_is_named_from_the_status():
    stages = [stage_of(s, "classify") for s in COLD_START]
    assert [s.key for s in stages] == list(STAGES)
    assert [s.text for s in stages] == [
        "0/1 replicas ready",
        "waiting; no model uploaded yet (a first call exports and uploads it)",
        "uploading the model: 3.0 MB of 8.0 MB",
        "model uploaded (8.0 MB); waiting for a unit",
        "sending the model to unit local/cpu-1's GPU Manager",
        "loading the model on unit local/cpu-1 (2 s)",
        "model loaded on unit local/cpu-1 in 2.5 s",
    ]
    assert stage_of(status(), "other") is None  # not a function of the stack
    assert stage_of({**status(), "scheduler": {"configured": False}}, "classify") is None  # no GPU path


def test_a_terminal_sees_the_stages_in_order_and_the_line_is_wiped_at_the_end():
    term = FakeTerminal()
    polled = iter(COLD_START)
    done = threading.Event()

    def fetch():
        s = next(polled, None)
        if s is None:
            done.set()
            return COLD_START[-1]
        return s

    import faas_gpu.cli.progress as progress

    progress.POLL_S, saved = 0.01, progress.POLL_S
    try:
        with Progress("classify", file=term) as line:
            line.watch(fetch, None, delay_s=0)
            assert done.wait(10)
    finally:
        progress.POLL_S = saved
    assert [s.key for s in line.shown] == list(STAGES)
    out = term.getvalue()
    positions = [out.index(f"classify: {s.text}") for s in line.shown]
    assert positions == sorted(positions)  # drawn in that order, each once
    assert out.endswith("\r")  # leave=False: tqdm wiped the line for the command's own output


def test_not_a_terminal_is_quiet_and_asks_for_nothing():
    pipe = io.StringIO()
    asked = []
    with Progress("classify", file=pipe) as line:
        line.watch(lambda: asked.append(1) or COLD_START[0], None, delay_s=0)
        line.show(Stage("replicas", "0/1 replicas ready"))
    assert pipe.getvalue() == "" and asked == [] and line.shown == []
    term = FakeTerminal()
    with Progress("classify", file=term, enabled=False) as line:  # --no-progress
        line.watch(lambda: asked.append(1) or COLD_START[0], None, delay_s=0)
        line.show(Stage("replicas", "0/1 replicas ready"))
    assert term.getvalue() == "" and asked == []
