"""PROTEAN's Job Distribution (§4.3, Alg. 1) live: the scheduler chooses the MIG slice of each job.

The unit preference hook of the LALB policies is tested on its own (pure, driven by hand); then
the scheduler over real GPU Managers on fake NVML GPUs (tests/fake_nvml.py) that report their
units into a datastore, one placement round at a time (`Scheduler._round`), and once with the
scheduler's loop running jobs on the manager over HTTP.
"""

from __future__ import annotations

import random
import time

import pytest
import torch

from faas_gpu.contract.wire import encode
from faas_gpu.policies import LALBScheduler, LBScheduler, Model, ModelCache, Request, Unit
from faas_gpu.policies.lalb_job_distribution import JobClass, JobDistributionPreference, MigSlice, be_footprint
from faas_gpu.policies.protean.distribution import JobDistributor, SliceState
from faas_gpu.policy_data.protean import default_assumptions
from tests.fake_nvml import FakeGPU
from tests.fake_worker import stored_program
from tests.scheduler.live_node import LiveNode

SD = default_assumptions().slowdown
A100_SLICES = [("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)]


# -- the unit preference hook of the LALB policies (pure) ------------------------------------


def _policy(n: int = 3, cls=LALBScheduler, **kw) -> LALBScheduler | LBScheduler:
    models = {m: Model(m, 100, load_s=1.0, infer_s=0.1) for m in ("a", "b", "c")}
    return cls([Unit(i, ModelCache(1000)) for i in range(n)], models, **kw)


def _run(policy, requests: list[Request], now: float = 0.0) -> list[tuple[int, int]]:
    for r in requests:
        policy.submit(r, now)
    return [(d.request.id, d.unit) for d in policy.schedule(now)]


def _cache(policy, unit: int, model: str) -> None:
    policy.units[unit].cache.load(model, 100)
    policy.holders.setdefault(model, set()).add(unit)


def test_no_preference_leaves_lalb_o3_as_it_was():
    """A hook with no opinion changes nothing: the same trace gives the same dispatches."""
    rng = random.Random(7)
    trace = [(t * 0.05, rng.choice("abc")) for t in range(400)]
    runs = []
    for hook in (None, lambda request, idle: None):
        p = _policy(4, o3_limit=3)
        p.unit_preference = hook
        out, busy = [], []
        for i, (t, m) in enumerate(trace):
            for u in [u for u, until in busy if until <= t]:
                p.complete(u, t)
            busy = [(u, until) for u, until in busy if until > t]
            p.submit(Request(i, m, t), t)
            for d in p.schedule(t):
                out.append((d.request.id, d.unit, d.hit))
                busy.append((d.unit, t + d.duration))
        runs.append(out)
    assert runs[0] == runs[1] and len(runs[0]) > 100


def test_the_preference_comes_first_and_locality_breaks_its_ties():
    p = _policy(3)
    _cache(p, 2, "a")
    p.unit_preference = lambda r, idle: [1, 2]  # units 1 and 2 equally good; 2 caches "a"
    assert _run(p, [Request(0, "a", 0.0)]) == [(0, 2)]
    p = _policy(3)
    _cache(p, 2, "a")  # a hit on unit 2 (LALB's Alg. 2 would send it there) ...
    p.unit_preference = lambda r, idle: [1]  # ... but the preference wants unit 1 only
    assert _run(p, [Request(0, "a", 0.0)]) == [(0, 1)]


def test_among_equal_units_lalb_keeps_its_own_unit_then_the_least_dispatched():
    p = _policy(3)
    p.units[0].dispatches = 5
    p.unit_preference = lambda r, idle: [0, 1, 2]  # no opinion between them, none caches "b"
    assert _run(p, [Request(0, "b", 0.0)]) == [(0, 1)]  # LALB serves unit 1 first (fewest dispatches)
    p = _policy(3)
    p.unit_preference = lambda r, idle: [0, 2]  # unit 1 (served first) is not wanted
    assert _run(p, [Request(0, "b", 0.0)]) == [(0, 0)]


def test_a_unit_takes_a_cached_request_out_of_order_only_where_the_preference_accepts_it():
    p = _policy(2)
    _cache(p, 0, "a")
    wanted = {0: [0, 1], 1: [1]}  # request 0 ("b") anywhere; request 1 ("a", cached on 0) on 1 only
    p.unit_preference = lambda r, idle: wanted[r.id]
    out = _run(p, [Request(0, "b", 0.0), Request(1, "a", 0.0)])
    assert sorted(out) == [(0, 0), (1, 1)]  # unit 0 does not overtake with "a": it takes "b"
    p = _policy(2)
    _cache(p, 0, "a")
    out = _run(p, [Request(0, "b", 0.0), Request(1, "a", 0.0)])
    assert out[0] == (1, 0)  # without the preference, LALB-O3 overtakes with the hit


def test_a_preference_naming_no_idle_unit_counts_as_no_opinion():
    p = _policy(2)
    p.units[0].dispatches = 1
    p.unit_preference = lambda r, idle: [7]  # no such idle unit
    assert _run(p, [Request(0, "a", 0.0)]) == [(0, 1)]
    p = _policy(2)
    p.units[0].dispatches = 1
    p.unit_preference = lambda r, idle: []
    assert _run(p, [Request(0, "a", 0.0)]) == [(0, 1)]


def test_a_request_the_preference_places_never_waits_in_a_busy_units_local_queue():
    p = _policy(2)
    _cache(p, 0, "a")
    assert _run(p, [Request(0, "a", 0.0)]) == [(0, 0)]  # unit 0 busy for 0.1 s, with "a" cached
    assert _run(p, [Request(1, "a", 0.0)]) == []  # LALB: waits for the holder (0.1 s < load 1 s)
    assert list(p.units[0].local_queue) and p.queued() == 1
    p = _policy(2)
    _cache(p, 0, "a")
    p.unit_preference = lambda r, idle: [u.id for u in idle]
    assert _run(p, [Request(0, "a", 0.0), Request(1, "a", 0.0)]) == [(0, 0), (1, 1)]


def test_lb_honours_the_preference_too():
    p = _policy(3, cls=LBScheduler)
    p.unit_preference = lambda r, idle: [2] if r.id == 0 else None
    assert _run(p, [Request(0, "a", 0.0), Request(1, "b", 0.0)]) == [(0, 2), (1, 0)]


# -- Alg. 1 as a preference (pure) -----------------------------------------------------------


def _slices(gpu, first_id: int, running: dict[int, tuple[str, bool]] | None = None) -> list[MigSlice]:
    running = running or {}
    out = []
    for i, key in enumerate(("4g", "2g", "1g")):
        uid = first_id + i
        run = running.get(uid)
        mem = SD.spec(run[0]).mem_mb if run else 0.0
        state = SliceState(
            uid, key, SD.gpu.memory_mb(key), mem, (run,) if run else (), True, mem if run and run[1] else 0.0
        )
        out.append(MigSlice(gpu, state))
    return out


def _idle(*ids: int) -> list[Unit]:
    return [Unit(i, ModelCache(1)) for i in ids]


def test_be_footprint_counts_known_best_effort_models_per_gpu():
    counts = {("g0", True, "resnet50"): 1.5, ("g0", True, "bert"): 2.0, ("g0", False, "vgg19"): 3, ("g1", True, "x"): 4}
    mem, top = be_footprint(counts, SD)
    assert mem == {"g0": pytest.approx(1.5 * 5120 + 2 * 3072)}
    assert top == {"g0": "bert"}


def test_strict_jobs_take_the_least_eta_slice_and_ties_across_gpus_are_left_to_locality():
    slices = _slices("g0", 0) + _slices("g1", 3)
    jobs = {1: JobClass("resnet50", True), 2: JobClass("shufflenet_v2", False), 3: JobClass("nope", True)}
    pref = JobDistributionPreference(JobDistributor(SD), slices, jobs, {})
    assert sorted(pref(Request(1, "d", 0.0), _idle(*range(6)))) == [0, 3]  # both 4g: locality decides
    assert pref(Request(1, "d", 0.0), _idle(1, 2, 5)) == [1]  # the 4gs busy: the 2g (eta 2.48 < 4.97)
    assert sorted(pref(Request(2, "d", 0.0), _idle(*range(6)))) == [2, 5]  # best effort: the 1gs
    assert pref(Request(3, "d", 0.0), _idle(*range(6))) is None  # no slowdown spec
    assert pref(Request(9, "d", 0.0), _idle(*range(6))) is None  # not a job it knows
    assert pref(Request(1, "d", 0.0), _idle(7, 8)) is None  # no MIG slice idle
    assert pref(Request(1, "d", 0.0), _idle(1, 7)) == [1, 7]  # units it does not manage stay open


def test_a_best_effort_backlog_tags_every_slice_and_sends_a_narrow_strict_job_off_the_4g():
    """Alg. 1: 8 resnet50 batches (40 GB) tag the 1g, the 2g and the 4g fully; a strict shufflenet
    then runs alone as fast on the 2g (RDF 1.27) as on the 4g (RDF 1) but expects half the BE
    interference there: eta 1.27 x (0.18 + 2 x 0.55) < 1 x (0.18 + 4 x 0.55)."""
    jobs = {1: JobClass("shufflenet_v2", True)}
    pref = JobDistributionPreference(JobDistributor(SD), _slices("g0", 0), jobs, {"g0": 8 * 5120}, {"g0": "resnet50"})
    assert pref.tags == {0: 1.0, 1: 1.0, 2: 1.0}
    assert pref(Request(1, "d", 0.0), _idle(0, 1, 2)) == [1]
    calm = JobDistributionPreference(JobDistributor(SD), _slices("g0", 0), jobs, {})
    assert calm(Request(1, "d", 0.0), _idle(0, 1, 2)) == [0]


# -- the scheduler over a live GPU Manager ---------------------------------------------------


@pytest.fixture
def a100(tmp_path):
    n = LiveNode(tmp_path, [(FakeGPU.a100_40gb(), A100_SLICES)])
    yield n
    n.close()


def test_a_strict_job_lands_on_the_4g_and_best_effort_jobs_on_the_small_slices(a100):
    assert sorted(u.profile for u in a100.scheduler._units) == ["1g.5gb", "2g.10gb", "4g.20gb"]
    a100.submit("shufflenet_v2", best_effort=True)
    a100.submit("resnet50")
    assert a100.round() == ["1g.5gb", "4g.20gb"]  # BE: first fit, the 1g; strict: the 4g
    a100.submit("shufflenet_v2", best_effort=True)
    assert a100.round() == ["2g.10gb"]  # the 1g busy: the next smallest that fits


def test_slices_are_sized_as_their_managers_report_them_not_by_their_nominal_size(a100):
    """Finding 7: NVML says an A100's 1g.5gb has 4864 MiB, the assumptions file 5120. A resnet50
    BE batch (5120 MiB) fits the nominal 1g but not the real one: it goes to the 2g, not to a 507."""
    one_g = next(u for u in a100.scheduler._units if u.profile == "1g.5gb")
    assert one_g.memory_mb == 4864 and SD.gpu.memory_mb("1g") == 5120
    a100.submit("resnet50", best_effort=True)
    assert a100.round() == ["2g.10gb"]


def test_a_strict_job_goes_to_the_least_eta_idle_slice_while_the_4g_is_busy(a100):
    first = a100.submit("resnet50")
    assert a100.round() == ["4g.20gb"]
    a100.submit("bert")
    assert a100.round() == ["2g.10gb"]
    assert SD.eta("bert", "2g") < SD.eta("bert", "1g")  # 1.56 vs 3.11: what is idle, least eta
    third = a100.submit("bert")
    assert a100.round() == ["1g.5gb"]  # the only slice left
    a100.finish(first)
    a100.submit("bert")
    assert a100.round() == ["4g.20gb"] and third.unit is not None


def test_a_best_effort_backlog_moves_a_narrow_strict_job_to_the_2g(a100):
    """Eight resnet50 BE batches waiting (40 GB) tag every slice; shufflenet is no slower alone
    on the 2g than on the 4g and expects less BE interference there (see the pure test)."""
    a100.submit("shufflenet_v2")  # handed to LALB at once; the BE jobs after it wait their turn
    for _ in range(8):
        a100.submit("resnet50", best_effort=True)
    # the 1g as NVML sizes it (4864 MiB) holds no resnet50 batch (5120): the first BE batch takes
    # the 4g; the 1g is left to LALB, the preference having no slice that fits to name
    assert a100.round() == ["2g.10gb", "4g.20gb", "1g.5gb"]


def test_jobs_without_a_known_model_keep_lalb_o3s_choice(tmp_path):
    gpus = [(FakeGPU.a100_40gb(), A100_SLICES)]
    live = LiveNode(tmp_path, gpus, name="protean")
    plain = LiveNode(tmp_path, gpus, distribution=False, name="plain")
    try:
        for model in (None, "not-in-the-assumptions", None):
            for n in (live, plain):
                n.submit(model, best_effort=model is None)
        assert live.round() == plain.round()
        assert live.scheduler._policy.unit_preference is not None  # the hook was asked, and had no opinion
    finally:
        live.close()
        plain.close()


def test_units_that_are_not_mig_slices_of_a_known_gpu_keep_lalb_o3s_choice(tmp_path):
    """A whole A100 (MIG off) and an H100 in MIG mode (not the assumptions' GPU): no slice to choose."""
    gpus = [(FakeGPU.a100_40gb(mig=False), []), (FakeGPU.h100_80gb(), [("4g.40gb", 0), ("3g.40gb", 4)])]
    live = LiveNode(tmp_path, gpus, name="protean")
    plain = LiveNode(tmp_path, gpus, distribution=False, name="plain")
    try:
        assert live.scheduler._unit_gpu == {}
        for model, be in (("resnet50", False), ("shufflenet_v2", True), ("bert", False)):
            for n in (live, plain):
                n.submit(model, best_effort=be)
        got = live.round()
        assert got == plain.round() and len(got) == 3
        assert live.scheduler._policy.unit_preference is None
    finally:
        live.close()
        plain.close()


def test_a_whole_gpu_beside_mig_slices_stays_open_to_lalb(tmp_path):
    """PROTEAN chooses among the MIG slices only; a unit it does not manage is LALB's to use."""
    node = LiveNode(tmp_path, [(FakeGPU.a100_40gb(), A100_SLICES), (FakeGPU.a100_40gb(mig=False), [])])
    try:
        assert len(node.scheduler._unit_gpu) == 3 and len(node.scheduler._units) == 4
        node.submit("resnet50")
        node.submit("resnet50")
        node.submit("shufflenet_v2", best_effort=True)
        # LALB serves the whole GPU first (the least dispatched, then by id: "GPU-" sorts before
        # "MIG-") and PROTEAN has no opinion on it; the next strict job gets the 4g, BE the 1g
        assert node.round() == ["gpu-1", "4g.20gb", "1g.5gb"]
    finally:
        node.close()


def test_two_gpus_leave_the_tie_between_their_4gs_to_the_model_cache(tmp_path):
    node = LiveNode(tmp_path, [(FakeGPU.a100_40gb(), A100_SLICES), (FakeGPU.a100_40gb(), A100_SLICES)])
    try:
        other = stored_program(node.scheduler.store, "other")
        first = node.submit("resnet50", digest=other)
        assert node.round() == ["4g.20gb"]
        cached_on = first.unit
        node.finish(first)
        node.submit("resnet50")  # the default model: cached nowhere, either 4g
        node.submit("resnet50", digest=other)  # cached on the first 4g: goes there
        assert node.round() == ["4g.20gb", "4g.20gb"]
        jobs = sorted(node.scheduler._jobs.values(), key=lambda j: j.id)
        assert jobs[-1].unit == cached_on and jobs[-2].unit != cached_on
    finally:
        node.close()


def test_the_running_scheduler_sends_jobs_to_the_managers_slices(a100):
    """The loop and the manager's job API: a held strict job runs on the 4g, a BE one on the 1g."""
    s = a100.scheduler
    a100.now = time.monotonic()
    s.clock = time.monotonic
    s.start()
    x = encode(torch.ones(1, 4))
    strict = s.submit(a100.digest, x, 30.0, model="resnet50")
    be = s.submit(a100.digest, x, best_effort=True, model="shufflenet_v2")
    busy = {}
    deadline = time.monotonic() + 20
    while len(busy) < 2:
        assert time.monotonic() < deadline, busy
        busy = {st.info.profile for st in a100.manager.units.values() if st.busy_since is not None}
        time.sleep(0.01)
    assert busy == {"4g.20gb", "1g.5gb"}
    a100.gate.set()
    assert strict.done.wait(20) and be.done.wait(20)
    assert strict.outcome.status == 200 and be.outcome.status == 200


def test_the_flag_defaults_to_protean_with_reconfigure_and_shows_in_status(tmp_path):
    import requests

    from scheduler.daemon import parse_args
    from tests.daemon_process import Daemon

    assert parse_args(["--home", str(tmp_path)]).distribution == "off"
    assert parse_args(["--home", str(tmp_path), "--reconfigure"]).distribution == "protean"
    assert parse_args(["--home", str(tmp_path), "--reconfigure", "--distribution", "off"]).distribution == "off"
    assert parse_args(["--home", str(tmp_path), "--distribution", "protean"]).distribution == "protean"
    home = tmp_path / "home"
    home.mkdir()
    sched = Daemon("scheduler", home, "--distribution", "protean")
    try:
        token = (home / "secrets" / "gpu-manager-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        status = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=5).json()
        assert status["distribution"] == "protean"
    finally:
        sched.kill()
