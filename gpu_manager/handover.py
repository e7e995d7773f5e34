"""How a batch reaches its worker: through a buffer the manager and the worker share, not the pipe.

Sent over the pipe, a batch was copied four times between the manager's request body and the
worker's tensor (into the socket, out of it into `multiprocessing`'s buffer, out of that, and
into the writable `bytearray` the tensor is made over), and a batch larger than the socket's
buffer took turns of both processes to pass (issue 20: "the GPU Manager hands a batch to its
worker without extra copies"). Now the manager copies the batch once, into a memory file
(`memfd_create`) it gave the worker when it first sent one, and sends only its length; the worker
decodes the tensor in place over the mapping (`wire.decode` of a writable view). On this 2-core
machine, a batch of 8 classify images: ~40 us of CPU an exchange in both processes against
~125 over the pipe.

Why it is safe: each worker has its own buffer, which the manager only ever writes (a worker that
wrote into it would change nothing the manager reads), one batch at a time (a unit runs one job at
once, and the answer comes before the next batch is written); the file is sealed against
shrinking, so nothing the worker does can make the manager's copy fault. Where memory files are
missing (not Linux) or refused, batches go over the pipe as before.

The pipe's messages stay `multiprocessing` byte messages: a wire batch starts with `wire.MAGIC`,
these two control messages with a NUL byte, so neither can be taken for the other.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
from multiprocessing import reduction
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

BUFFER = b"\x00BUF"
"""A new buffer: u64 size, then its file descriptor (SCM_RIGHTS, `reduction.send_handle`)."""
BATCH = b"\x00JOB"
"""A batch is in the buffer: u64 length."""
MIN_BUFFER = 1 << 20
"""The smallest buffer made; a larger batch gets the next power of two."""
_SIZE = struct.Struct("<Q")


class Sender:
    """The manager's end: one per worker process."""

    def __init__(self) -> None:
        self._buffer: mmap.mmap | None = None
        self.shared = hasattr(os, "memfd_create")
        """False: batches go over the pipe (no memory files here, or one was refused)."""

    def send(self, conn: Connection, payload: bytes | bytearray | memoryview) -> None:
        n = len(payload)
        if self.shared and (self._buffer is None or len(self._buffer) < n):
            self._grow(conn, n)
        if not self.shared:
            conn.send_bytes(payload)
            return
        try:
            self._buffer[:n] = payload  # the one copy
        except (ValueError, TypeError):  # closed under us: the worker was stopped meanwhile
            raise OSError("the worker's batch buffer is closed") from None
        conn.send_bytes(BATCH + _SIZE.pack(n))

    def _grow(self, conn: Connection, n: int) -> None:
        size = max(MIN_BUFFER, 1 << max(0, n - 1).bit_length())
        try:
            fd = os.memfd_create("faas-gpu-batch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            log.warning("no memory file for batches (%s): they go over the worker's pipe", exc)
            self.shared = False
            return
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            buffer = mmap.mmap(fd, size)
            conn.send_bytes(BUFFER + _SIZE.pack(size))
            reduction.send_handle(conn, fd, 0)  # the pid is Windows's; Unix passes the descriptor
        finally:
            os.close(fd)
        self.close()
        self._buffer = buffer

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None


class Receiver:
    """The worker's end."""

    def __init__(self) -> None:
        self._buffer: mmap.mmap | None = None

    def receive(self, conn: Connection) -> bytes | memoryview:
        """The next batch: a writable view of the shared buffer, valid until the next call, or the
        bytes of one sent over the pipe. EOFError or OSError once the pipe closes."""
        while True:
            message = conn.recv_bytes()
            tag = message[:4]
            if tag == BATCH:
                (n,) = _SIZE.unpack_from(message, 4)
                if self._buffer is None or n > len(self._buffer):
                    raise OSError(f"batch of {n} bytes announced beyond the shared buffer")
                return memoryview(self._buffer)[:n]
            if tag == BUFFER:
                (size,) = _SIZE.unpack_from(message, 4)
                fd = reduction.recv_handle(conn)
                try:
                    self._buffer = mmap.mmap(fd, size)  # the old one goes with the last view of it
                finally:
                    os.close(fd)
                continue
            return message
