"""A GPU Manager worker without a process, and a stored program for it to (not) run: the MIG, MPS
and scheduler tests drive the manager over fake NVML GPUs (tests/fake_nvml.py) where placement,
not inference, is under test."""

from __future__ import annotations

import io
import threading
import zipfile

from faas_gpu.models import ModelStore


class FakeWorker:
    """A model worker without a process: echoes the batch; `gate` holds a job until set."""

    made: list[FakeWorker] = []

    def __init__(self, artifact, device, env=None, gate: threading.Event | None = None):
        self.artifact, self.device, self.env, self.gate = artifact, device, env, gate
        self.alive = False
        FakeWorker.made.append(self)

    def start(self):
        self.alive = True

    def run(self, payload, timeout_s=60):
        if self.gate is not None:
            assert self.gate.wait(10)
        return payload

    def stop(self):
        self.alive = False


PROGRAM_WITHOUT_INPUT = '{"graph_module": {"signature": {"input_specs": []}, "graph": {"tensor_values": {}}}}'


def program_archive(tag: str | bytes = "m") -> bytes:
    """A minimal program's bytes, as the model store accepts them (a torch.export program's layout),
    without torch; each `tag` gives distinct bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("m/archive_format", "pt2")  # a torch.export program's layout (pickles are refused)
        z.writestr("m/models/model.json", PROGRAM_WITHOUT_INPUT)  # read for its batch: unknown
        z.writestr("m/data/extra/tag", tag)
    return buf.getvalue()


def stored_program(store: ModelStore, tag: str = "m") -> str:
    """The digest of a minimal program put in `store`; each `tag` gives a distinct digest."""
    return store.put(program_archive(tag)).digest
