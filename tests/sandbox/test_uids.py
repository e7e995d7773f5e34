"""Each function's own uid (`faas_gpu.sandbox.uids`): stable, never shared, never a host user's."""

from __future__ import annotations

import pwd

import pytest

from faas_gpu.sandbox import uids
from faas_gpu.sandbox.primitives import SandboxError
from faas_gpu.sandbox.uids import FIRST_UID, UID_COUNT, UidTable


def test_each_function_keeps_its_uid_across_restarts_and_no_two_share_one(tmp_path):
    table = UidTable(tmp_path / "uids.json")
    a, b = table.uid("openfaas-fn/a"), table.uid("openfaas-fn/b")
    assert a != b and all(FIRST_UID <= u < FIRST_UID + UID_COUNT for u in (a, b))
    again = UidTable(tmp_path / "uids.json")
    assert again.uid("openfaas-fn/b") == b and again.uid("openfaas-fn/a") == a


def test_uids_of_this_hosts_users_are_never_given(tmp_path):
    real = sorted(u.pw_uid for u in pwd.getpwall())
    first = real[-1]  # a real user's uid, and the two after it
    table = UidTable(tmp_path / "uids.json", first=first, count=3)
    given = {table.uid(f"ns/f{i}") for i in range(2)}
    assert first not in given and len(given) == 2
    with pytest.raises(SandboxError, match="no free uid"):
        table.uid("ns/third")


def test_uids_in_other_users_subordinate_ranges_are_never_given(monkeypatch, tmp_path):
    monkeypatch.setattr(uids, "_subordinate_ranges", lambda: [(FIRST_UID, FIRST_UID + 3)])  # /etc/subuid's
    table = UidTable(tmp_path / "uids.json", first=FIRST_UID, count=4)
    assert table.uid("ns/f") == FIRST_UID + 3
