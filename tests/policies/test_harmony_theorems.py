"""funcProvision's binary searches (Theorems 1-2) give what a brute-force search gives on small ranges."""

import math

import pytest

from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.harmony import ALIBABA_FC_CNY, PAPER_PRICES, Load, Platform, Provisioner
from faas_gpu.policy_data.harmony import load_models

DATA = SHARED_DATA / "harmonybatch"
MODELS = load_models(DATA / "model.json")
SMALL = Platform(vcpu_min=0.05, vcpu_max=4.0, gpu_min_gb=1, gpu_max_gb=8, gpu_batch_max=16)
LOADS = [
    Load((0.5,), (5.0,)),
    Load((1.0,), (20.0,)),
    Load((2.0,), (3.0,)),
    Load((0.8, 1.0), (10.0, 20.0)),
    Load((0.6, 0.9, 1.4), (2.0, 7.0, 4.0)),
    Load((2.4, 2.6), (15.0, 1.0)),
]


def brute_force_cpu(prov: Provisioner, load: Load, batch: int):
    """Every grid size meeting the constraints; the one Eq. 13 (Theorem 1's objective) prices lowest."""
    m, pf = prov.model, prov.platform
    feasible = []
    for c in pf.vcpu_grid:
        if pf.cpu_memory_gb(c, m.cpu.memory_mb(batch)) is None:
            continue
        lmax = m.cpu_latency_max(c, batch)
        if lmax > load.slo:
            continue
        if batch > 1 and batch - 1 > load.rate * prov.group_timeout(load, lmax):
            continue
        feasible.append(c)
    if not feasible:
        return None
    return min(feasible, key=lambda c: prov.eq13(c, batch))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("load", LOADS, ids=lambda ld: f"{ld.slos}@{ld.rates}")
def test_theorem1_matches_brute_force(name, load):
    prov = Provisioner(MODELS[name], PAPER_PRICES, SMALL)
    for b in prov.cpu_batches():
        got = prov.cpu_for_batch(load, b)
        want = brute_force_cpu(prov, load, b)
        if want is None:
            assert got is None
        else:
            assert got is not None
            assert prov.eq13(got, b) == pytest.approx(prov.eq13(want, b), rel=1e-12)


def test_theorem1_root_is_where_eq14_changes_sign():
    prov = Provisioner(MODELS["VGG19"], PAPER_PRICES)
    c0 = prov.cost_root(1)
    cv = MODELS["VGG19"].cpu.avg[0]

    def d(c):
        return cv.alpha * (1 - c / cv.beta) * math.exp(-c / cv.beta) + cv.gamma

    assert d(c0 - 1e-6) < 0 < d(c0 + 1e-6)
    assert c0 == pytest.approx(1.595, abs=0.005)


def brute_force_gpu_batch(prov: Provisioner, load: Load, shape: int):
    gb, vcpu, _, b_max = prov.gpu_shapes[shape]
    ok = []
    for b in range(1, b_max + 1):
        lmax = prov.model.gpu_latency_max(gb, b, vcpu)
        if lmax <= load.slo and (b == 1 or b - 1 <= load.rate * prov.group_timeout(load, lmax)):
            ok.append(b)
    return max(ok) if ok else None


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("load", LOADS, ids=lambda ld: f"{ld.slos}@{ld.rates}")
def test_theorem2_batch_search_matches_brute_force(name, load):
    prov = Provisioner(MODELS[name], PAPER_PRICES, SMALL)
    assert prov.gpu_shapes
    for k in range(len(prov.gpu_shapes)):
        assert prov.gpu_batch_for(load, k) == brute_force_gpu_batch(prov, load, k)


@pytest.mark.parametrize("load", LOADS, ids=lambda ld: f"{ld.slos}@{ld.rates}")
def test_theorem2_gives_the_cheapest_gpu_function_where_eq16_holds(load):
    """With Eq. 6's prices (no per-second GPU billing) and no host share, the cost falls with b
    (Eq. 16), so the largest feasible batch of each size is the cheapest over every (m, b)."""
    prov = Provisioner(MODELS["VGG19"], PAPER_PRICES, SMALL)
    best = None
    for gb, vcpu, mem, b_max in prov.gpu_shapes:
        for b in range(1, b_max + 1):
            lmax = prov.model.gpu_latency_max(gb, b, vcpu)
            if lmax > load.slo or (b > 1 and b - 1 > load.rate * prov.group_timeout(load, lmax)):
                continue
            cost = prov.priced("gpu", load, vcpu, mem, gb, b).cost_per_request
            best = cost if best is None else min(best, cost)
    got = prov.gpu(load)
    if best is None:
        assert got is None
    else:
        assert got.cost_per_request == pytest.approx(best, rel=1e-12)


def test_knee_rate_is_where_one_app_moves_to_a_gpu():
    prov = Provisioner(MODELS["VGG19"], ALIBABA_FC_CNY)
    knee = prov.knee_rate(1.0)
    assert 1 < knee < 40
    assert not prov.past_knee(1.0, knee - 0.01)
    assert prov.past_knee(1.0, knee + 0.01)
    assert prov.best(Load((1.0,), (knee + 0.01,))).kind == "gpu"
