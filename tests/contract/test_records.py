"""The records' MAC (`faas_gpu.contract.records`): what the daemons seal, they alone can seal."""

from __future__ import annotations

import pytest

from faas_gpu.contract import lease, records

KEY = records.record_key("cluster-token")


def test_a_sealed_value_opens_under_its_key_and_reads_as_written():
    stored = records.seal(KEY, "/faas-gpu/functions/ns/f", b'{"a": 1}')
    assert stored.startswith(records.MAGIC) and stored.endswith(b'{"a": 1}')  # readable with etcdctl
    assert records.unseal(KEY, "/faas-gpu/functions/ns/f", stored) == b'{"a": 1}'
    assert records.unseal(KEY, "/k", records.seal(KEY, "/k", b"")) == b""
    assert records.seal(KEY, "/k", b"v") == records.seal(KEY, "/k", b"v")  # deterministic: CAS on values works


@pytest.mark.parametrize(
    "forge",
    [
        lambda s: s.replace(b"cat", b"sh "),  # the value changed, the MAC kept
        lambda s: s[: len(records.MAGIC)] + b"A" * 43 + s[len(records.MAGIC) + 43 :],  # a made-up MAC
        lambda s: records.seal(records.record_key("another cluster"), "/faas-gpu/functions/ns/f", b'{"p": "cat"}'),
        lambda s: records.seal(KEY, "/faas-gpu/functions/ns/other", b'{"p": "cat"}'),  # moved from another key
    ],
    ids=["changed-value", "made-up-mac", "another-cluster", "another-key"],
)
def test_a_changed_moved_or_foreign_record_fails_its_mac(forge):
    stored = forge(records.seal(KEY, "/faas-gpu/functions/ns/f", b'{"p": "cat"}'))
    with pytest.raises(records.RecordError) as caught:
        records.unseal(KEY, "/faas-gpu/functions/ns/f", stored)
    assert caught.value.reason == records.FORGED and records.is_sealed(stored)


@pytest.mark.parametrize("stored", [b'{"p": "cat"}', b"", records.MAGIC, records.MAGIC + b"x" * 43, b"\xff" * 80])
def test_a_value_without_the_sealed_form_is_unsigned(stored):
    with pytest.raises(records.RecordError) as caught:
        records.unseal(KEY, "/k", stored)
    assert caught.value.reason == records.UNSIGNED and not records.is_sealed(stored)


def test_the_record_key_is_derived_for_its_purpose_alone():
    """Not the token itself, nor the placement lease's key: a MAC made for one use is no other's."""
    assert KEY != b"cluster-token" and len(KEY) == 32
    assert KEY != lease._key("cluster-token")
    assert KEY != records.record_key("cluster-token2")
    with pytest.raises(ValueError, match="empty"):
        records.record_key("")
