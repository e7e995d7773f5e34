"""Placement leases (`faas_gpu.contract.lease`): signed by the scheduler, checked by a GPU Manager."""

from __future__ import annotations

import pytest

from faas_gpu.contract.lease import CLOCK_SKEW_S, Lease, LeaseError, sign, token_sha256, verify

CLUSTER, FN = "cluster-token", "function-token"


def _lease(expires: float = 100.0) -> str:
    return sign(CLUSTER, Lease("d" * 64, "cpu-0", "classify.openfaas-fn", token_sha256(FN), expires))


def test_a_lease_is_good_for_its_model_unit_and_token_until_it_runs_out():
    got = verify(CLUSTER, _lease(), digest="d" * 64, unit="cpu-0", bearer=FN, now=99.0)
    assert got.function == "classify.openfaas-fn" and got.unit == "cpu-0"
    verify(CLUSTER, _lease(), digest="d" * 64, unit="cpu-0", bearer=FN, now=100.0 + CLOCK_SKEW_S - 0.01)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"digest": "e" * 64}, "another model"),
        ({"unit": "cpu-1"}, "another model or unit"),
        ({"bearer": CLUSTER}, "another function"),
        ({"bearer": None}, "token is required"),
        ({"now": 100.0 + CLOCK_SKEW_S + 0.01}, "run out"),
    ],
)
def test_a_lease_for_something_else_or_run_out_is_refused(change, why):
    args = {"digest": "d" * 64, "unit": "cpu-0", "bearer": FN, "now": 99.0, **change}
    with pytest.raises(LeaseError, match=why) as err:
        verify(CLUSTER, _lease(), **args)
    assert err.value.status == 401


def test_a_lease_not_signed_with_the_cluster_token_or_altered_is_refused():
    forged = sign("another-cluster", Lease("d" * 64, "cpu-0", "x.y", token_sha256(FN), 1e12))
    body, mac = _lease(expires=1.0).split(".")
    longer = sign(CLUSTER, Lease("d" * 64, "cpu-0", "x.y", token_sha256(FN), 1e12)).split(".")[0]
    for text in (forged, f"{longer}.{mac}", "garbage", "a.b.c", ""):
        with pytest.raises(LeaseError):
            verify(CLUSTER, text, digest="d" * 64, unit="cpu-0", bearer=FN, now=0.0)
    with pytest.raises(LeaseError):  # a manager without a token verifies nothing
        verify("", f"{body}.{mac}", digest="d" * 64, unit="cpu-0", bearer=FN, now=0.0)
