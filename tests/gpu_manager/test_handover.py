"""A batch reaches its worker through a shared memory file, copied once by the manager and decoded in
place by the worker; the pipe carries its length (`gpu_manager.handover`)."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
from multiprocessing import reduction

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager import handover
from gpu_manager.handover import Receiver, Sender
from gpu_manager.worker import Worker
from tests.gpu_manager.test_worker_load import Offset, exported


@pytest.fixture
def pipe():
    a, b = mp.get_context("spawn").Pipe()
    yield a, b
    a.close()
    b.close()


def test_a_batch_arrives_as_a_writable_view_of_the_shared_buffer(pipe):
    manager, worker = pipe
    sender, receiver = Sender(), Receiver()
    message = encode(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    sender.send(manager, message)
    view = receiver.receive(worker)
    assert isinstance(view, memoryview) and not view.readonly
    assert bytes(view) == message
    x = decode(view)
    x.add_(1)  # the tensor is the buffer itself: no copy was made
    assert bytes(view[-4:]) == struct.pack("<f", 12.0)
    sender.close()


def test_a_larger_batch_gets_a_larger_buffer_and_smaller_ones_reuse_it(pipe, monkeypatch):
    monkeypatch.setattr(handover, "MIN_BUFFER", 256)
    manager, worker = pipe
    sender, receiver = Sender(), Receiver()
    for rows in (2, 40, 3, 100, 1):
        message = encode(torch.randn(rows, 4))
        sender.send(manager, message)
        assert bytes(receiver.receive(worker)) == message
        assert len(sender._buffer) >= len(message)
    assert len(sender._buffer) == 2048  # 100 x 4 float32 and the header: the next power of two
    sender.close()


def test_the_buffer_cannot_be_shrunk_by_the_worker(pipe):
    manager, worker = pipe
    sender = Sender()
    sender.send(manager, encode(torch.zeros(2, 4)))
    assert worker.recv_bytes()[:4] == handover.BUFFER
    fd = reduction.recv_handle(worker)
    try:
        with pytest.raises(PermissionError):  # sealed: the manager's next copy can never fault
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    sender.close()


def test_without_memory_files_batches_go_over_the_pipe(pipe):
    manager, worker = pipe
    sender, receiver = Sender(), Receiver()
    sender.shared = False
    message = encode(torch.ones(2, 4))
    sender.send(manager, message)
    got = receiver.receive(worker)
    assert isinstance(got, bytes) and got == message


def test_a_worker_answers_batches_of_every_size_through_the_shared_buffer(tmp_path, monkeypatch):
    monkeypatch.setattr(handover, "MIN_BUFFER", 256)  # so that the buffer grows while it serves
    data, program = exported(Offset())
    reference = program.module()
    worker = Worker(ModelStore(tmp_path / "store").put(data), "cpu")
    try:
        worker.start()
        for rows in (1, 64, 2, 33, 64, 5):
            x = torch.randn(rows, 4)
            out = decode(worker.run(encode(x)))
            torch.testing.assert_close(out, reference(x))
        assert worker._batches.shared and len(worker._batches._buffer) >= 64 * 16
    finally:
        worker.stop()
    assert worker._batches._buffer is None  # a stopped worker's buffer is released
