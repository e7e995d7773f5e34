"""`/async-function` when its queue fails under it (issue 42): Redis that does not answer, the
state folder's disk full. A prompt, clear refusal, never a hang or a bare 500; nothing accepted
is lost, and a call resent with its call id runs once. A real stack process, a real Redis of the
test's own (SIGSTOPped), a real tmpfs filled to the last byte."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import requests

from tests.disk_full import fill, tmpfs
from tests.provider.async_stack import deploy, invocations
from tests.servers import RedisServer
from tests.stack_process import StackProcess
from tests.waiting import eventually


@pytest.mark.timeout(180)
def test_a_stopped_redis_is_a_prompt_503_naming_the_queue_and_a_resent_call_runs_once(tmp_path, receiver):
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    server.start()
    s = StackProcess(tmp_path / "home", "--redis", server.url, "--callback-allow", "127.0.0.1").start()
    try:
        deploy(s, "echo")
        headers = {"X-Callback-Url": receiver.url, "X-Call-Id": "during-outage"}
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            r = requests.post(f"{s.url}/async-function/echo", data=b"q", headers=headers, timeout=10)
            took = time.monotonic() - t0
            sync = requests.post(f"{s.url}/function/echo", data=b"still", timeout=10)  # invocations flow
            time.sleep(1)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert r.status_code == 503, (r.status_code, r.text)
        assert r.text.startswith("async queue: Redis at ") and r.headers["X-Call-Id"] == "during-outage"
        assert r.headers.get("Retry-After") == "1"
        print(f"503 after {took:.2f}s")
        assert took < 5, took
        assert sync.status_code == 200 and sync.content == b"still"
        before = invocations(s, "echo")
        r = requests.post(f"{s.url}/async-function/echo", data=b"q", headers=headers, timeout=10)  # the retry
        assert r.status_code == 202, r.text
        assert eventually(lambda: receiver.seen["during-outage"] >= 1, timeout_s=60), s.log_tail()
        time.sleep(1)
        assert receiver.seen["during-outage"] == 1
        assert invocations(s, "echo") == before + 1, "the call refused with 503 ran as well"
    finally:
        s.stop()
        server.stop()


@pytest.fixture
def small_home(tmp_path):
    with tmpfs(tmp_path / "home", "32m") as folder:
        yield folder


@pytest.mark.timeout(240)
def test_a_full_state_folder_is_a_507_naming_it_and_loses_no_accepted_call(tmp_path, small_home, receiver):
    s = StackProcess(small_home, "--callback-allow", "127.0.0.1")
    s.log_path = tmp_path / "stack.log"  # not on the disk the test fills
    s.start()
    try:
        deploy(s, "echo", "sh -c 'sleep 1; cat'")
        accepted: list[str] = []
        for _ in range(12):  # queued, most still waiting when the disk fills
            r = requests.post(
                f"{s.url}/async-function/echo", data=b"x", headers={"X-Callback-Url": receiver.url}, timeout=10
            )
            assert r.status_code == 202
            accepted.append(r.headers["X-Call-Id"])
        filler = fill(small_home)
        refused = None
        for _ in range(3000):  # the queue's journal may take a few more before it is full
            r = requests.post(
                f"{s.url}/async-function/echo", data=b"x" * 4096, headers={"X-Callback-Url": receiver.url}, timeout=10
            )
            if r.status_code != 202:
                refused = r
                break
            accepted.append(r.headers["X-Call-Id"])
        sync = requests.post(f"{s.url}/function/echo", data=b"still", timeout=30)  # invocations flow
        assert refused is not None, "the disk never filled"
        assert refused.status_code == 507, (refused.status_code, refused.text)
        assert refused.text.startswith(f"async queue: the state folder {small_home} is full"), refused.text
        assert refused.headers["X-Call-Id"] not in accepted
        assert sync.status_code == 200 and sync.content == b"still"
        done = threading.Event()
        threading.Timer(2, lambda: (filler.unlink(), done.set())).start()  # space comes back
        assert done.wait(10)
        assert eventually(lambda: all(receiver.seen[c] >= 1 for c in accepted), timeout_s=120), (
            len(accepted),
            sum(1 for c in accepted if receiver.seen[c]),
            s.log_tail(),
        )
        r = requests.post(
            f"{s.url}/async-function/echo", data=b"y", headers={"X-Callback-Url": receiver.url}, timeout=10
        )
        assert r.status_code == 202
        assert eventually(lambda: receiver.seen[r.headers["X-Call-Id"]] == 1, timeout_s=60)
        assert all(receiver.seen[c] == 1 for c in accepted), "a call was called back twice"
        print(f"accepted {len(accepted)} calls before the 507")
    finally:
        s.stop()
