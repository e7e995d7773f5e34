"""One slow function never blocks the gateway: past its in-flight limit it gets 429 at once, and
/healthz, /system/* and other functions keep answering while its requests are held (a real
stack process, real forked replicas that sleep)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.stack_process import StackProcess

THREADS = 16  # per function: 8; all invocations: 14 (2 kept for health and control plane)
SLEEP_S = 8


def _deploy(s: StackProcess, name: str, process: str, **extra) -> requests.Response:
    body = {"service": name, "image": "x", "envProcess": process, **extra}
    return requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=30)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = StackProcess(
        tmp_path_factory.mktemp("slow") / "home", "--threads", str(THREADS), "--callback-allow", "127.0.0.1"
    ).start()
    try:
        assert _deploy(s, "sleeper", f"sh -c 'sleep {SLEEP_S}; cat'").status_code == 202
        assert _deploy(s, "quick", "cat").status_code == 202
        s.wait_ready("sleeper")
        s.wait_ready("quick")
        yield s
    finally:
        s.stop()


def _post(url: str, data: bytes) -> tuple[int, float]:
    r = requests.post(url, data=data, timeout=120)
    return r.status_code, time.monotonic()


@pytest.mark.timeout(120)
def test_slow_function_gets_429_past_its_limit_and_never_blocks_health_system_or_others(stack):
    s = stack
    n = 3 * THREADS  # more than every gateway thread
    with ThreadPoolExecutor(n) as pool:
        slow = [pool.submit(_post, f"{s.url}/function/sleeper", b"zz") for _ in range(n)]
        time.sleep(1.0)  # the admitted ones are now held in the sleeping replica
        t0 = time.monotonic()
        health = requests.get(f"{s.url}/healthz", timeout=60)
        health_done = time.monotonic()
        listed = requests.get(f"{s.url}/system/functions", auth=s.auth, timeout=60)
        other = requests.post(f"{s.url}/function/quick", data=b"fast", timeout=60)
        others_done = time.monotonic()
        results = [f.result() for f in slow]
    first_slow_done = min(t for code, t in results if code == 200)
    codes = sorted(code for code, _ in results)
    assert health.status_code == 200 and listed.status_code == 200
    assert other.status_code == 200 and other.content == b"fast"
    assert others_done < first_slow_done, "health, /system and another function waited for the slow one"
    assert health_done - t0 < SLEEP_S / 2
    assert codes.count(200) == THREADS // 2, codes  # the function's share of the threads
    assert codes.count(429) == n - THREADS // 2, codes
    refused = [t for code, t in results if code == 429]
    assert max(refused) < first_slow_done, "the excess must be refused at once, not after waiting"


@pytest.mark.timeout(120)
def test_max_inflight_env_limits_a_function_at_the_gateway(stack):
    s = stack
    r = _deploy(s, "capped", f"sh -c 'sleep {SLEEP_S // 2}; cat'", envVars={"max_inflight": "2"})
    assert r.status_code == 202, r.text
    s.wait_ready("capped")
    with ThreadPoolExecutor(6) as pool:
        got = [f.result() for f in [pool.submit(_post, f"{s.url}/function/capped", b"c") for _ in range(6)]]
    codes = sorted(code for code, _ in got)
    assert codes == [200, 200, 429, 429, 429, 429], codes
    r = requests.post(f"{s.url}/function/capped", data=b"again", timeout=60)  # slots are given back
    assert r.status_code == 200 and r.content == b"again"


def test_bad_max_inflight_is_refused_at_deploy_naming_the_field(stack):
    r = _deploy(stack, "bad-inflight", "cat", envVars={"max_inflight": "lots"})
    assert r.status_code == 400
    assert "envVars.max_inflight" in r.text


def test_async_invocations_wait_for_a_slot_instead_of_429(stack):
    """Queued work holds no gateway thread: past the limit it waits, it is not answered 429."""
    s = stack
    r = _deploy(s, "capped-async", "sh -c 'sleep 1; cat'", envVars={"max_inflight": "1"})
    assert r.status_code == 202, r.text
    s.wait_ready("capped-async")
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    statuses: list[str] = []
    got_all = threading.Event()

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            statuses.append(self.headers.get("X-Function-Status", ""))
            if len(statuses) == 3:
                got_all.set()
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    try:
        cb = {"X-Callback-Url": f"http://127.0.0.1:{sink.server_port}/"}
        for i in range(3):
            r = requests.post(f"{s.url}/async-function/capped-async", data=b"%d" % i, headers=cb, timeout=10)
            assert r.status_code == 202
        assert got_all.wait(60)
        assert statuses == ["200", "200", "200"]
    finally:
        sink.shutdown()
