"""The state folder's disk full (issue 42): the control plane answers 507 naming the state folder,
never a bare 500 "database or disk is full"; nothing stored before is lost; invocations go on.

On a real small filesystem (a tmpfs mounted for the test: root only) holding a real stack's
state folder, filled up while the stack runs."""

from __future__ import annotations

import os
import subprocess

import pytest
import requests

from tests.stack_process import StackProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path) -> None:
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
        except OSError:
            pass


def _assert_507(r: requests.Response, home) -> None:
    assert r.status_code == 507, (r.status_code, r.text)
    assert str(home) in r.text and "disk space" in r.text, r.text
    assert r.headers["Content-Type"].startswith("text/plain")


def test_a_full_state_folder_answers_507_naming_it_loses_nothing_and_invocations_flow(small_disk):
    home = small_disk / "home"
    s = StackProcess(home)
    s.log_path = small_disk.parent / "stack.log"  # the test's log must not be what fails to write
    s.start()
    try:
        fn = {"service": "echo", "image": "x", "envProcess": "cat"}
        assert requests.post(f"{s.url}/system/functions", json=fn, auth=s.auth, timeout=10).status_code == 202
        secret = {"name": "api-key", "value": "before"}
        assert requests.post(f"{s.url}/system/secrets", json=secret, auth=s.auth, timeout=10).status_code == 202
        s.wait_ready("echo")
        filler = small_disk / "filler"
        _fill(filler)

        more = {"service": "another", "image": "x", "envProcess": "cat"}
        _assert_507(requests.post(f"{s.url}/system/functions", json=more, auth=s.auth, timeout=30), home)
        _assert_507(
            requests.put(f"{s.url}/system/functions", json={**fn, "labels": {"a": "b"}}, auth=s.auth, timeout=30), home
        )
        big = "x" * 200_000
        _assert_507(
            requests.post(f"{s.url}/system/secrets", json={"name": "new", "value": big}, auth=s.auth, timeout=30), home
        )
        _assert_507(
            requests.put(f"{s.url}/system/secrets", json={"name": "api-key", "value": big}, auth=s.auth, timeout=30),
            home,
        )
        for i in range(5):  # invocations keep flowing meanwhile
            r = requests.post(f"{s.url}/function/echo", data=f"call {i}".encode(), timeout=10)
            assert r.status_code == 200 and r.content == f"call {i}".encode(), r.text
        listed = requests.get(f"{s.url}/system/functions", auth=s.auth, timeout=10)
        assert listed.status_code == 200 and [f["name"] for f in listed.json()] == ["echo"]

        filler.unlink()  # space again: nothing was lost, and writes work
        assert (home / "function-secrets" / "openfaas-fn" / "api-key").read_text() == "before"
        assert sorted(p.name for p in (home / "function-secrets" / "openfaas-fn").iterdir()) == ["api-key"]
        assert requests.post(f"{s.url}/system/functions", json=more, auth=s.auth, timeout=30).status_code == 202
        s.wait_ready("another")
        r = requests.put(f"{s.url}/system/secrets", json={"name": "api-key", "value": "after"}, auth=s.auth, timeout=30)
        assert r.status_code == 202
        assert "Traceback" not in s.log_path.read_text()
    finally:
        s.stop()
