"""The profile store and INFless's latency predictor: round trip, fallback order, messages, sharing."""

import sqlite3

import pytest
import torch
from torch import nn

from faas_gpu.profiling import (
    Estimate,
    LatencyPredictor,
    MissingProfile,
    OpGraph,
    OpNode,
    ProfileStore,
    error_report,
    load_infless_profiles,
    profiles_db,
)
from faas_gpu.profiling.operators import profile_model, register_model

# src -> (a | b) -> join, combined as the sum (eager PyTorch) unless concurrent
FORK = OpGraph([OpNode("src", "s", "S"), OpNode("a", "a", "A", ("src",)), OpNode("b", "b", "B", ("src",)),
                OpNode("join", "j", "J", ("a", "b"))])  # fmt: skip
OPS = {"S": 1.0, "A": 4.0, "B": 2.0, "J": 1.0}

INFLESS_ROWS = """\
mini 2 0 1 30.000000
mini 2 0 4 50.5
mini 2 0 8 9999
mini 2 20 1 12.0
mini 4 0 1 20.0
"""


@pytest.fixture
def store(tmp_path):
    s = ProfileStore(tmp_path / "profiles.db")
    yield s
    s.close()


@pytest.fixture
def infless_dir(tmp_path):
    d = tmp_path / "infless"
    d.mkdir()
    (d / "mini-profile-results.txt").write_text(INFLESS_ROWS)
    (d / "other-profile-results.txt").write_text("other 2 0 1 9000\n")
    return d


def test_store_round_trip(tmp_path):
    path = tmp_path / "sub" / "p.db"
    with ProfileStore(path) as s:
        s.put_graph("m", FORK)
        s.put_ops(2, 1, "cpu", 0, OPS)
        s.put_ops(2, 1, "cuda", 100, {"S": 0.1})
        s.put_model("m", 2, 1, "cpu", 0, 7.5)
    with ProfileStore(path) as s:  # another connection reads what the first wrote
        assert s.graph("m") == FORK
        assert s.graph("nope") is None
        assert s.op_ms("A", 2, 1) == 4.0 and s.op_ms("A", 2, 2) is None
        assert s.ops_at({"A", "B", "X"}, 2, 1, "cpu", 0) == {"A": 4.0, "B": 2.0}
        assert s.op_configs({"S"}) == {(2, 1, "cpu", 0): {"S": 1.0}, (2, 1, "cuda", 100): {"S": 0.1}}
        assert s.model_ms("m", 2, 1) == 7.5 and s.model_profiles("m") == {(2, 1, "cpu", 0): 7.5}
        assert s.models() == ["m"]
        s.put_ops(2, 1, "cpu", 0, {"A": 5.0})  # a new measurement replaces the old
        assert s.op_ms("A", 2, 1) == 5.0


def test_store_refuses_impossible_rows(store):
    with pytest.raises(ValueError, match="share"):
        store.put_model("m", 1, 1, "cpu", 50, 1.0)
    with pytest.raises(ValueError, match="device"):
        store.put_ops(1, 1, "tpu", 0, {"A": 1.0})
    with pytest.raises(ValueError, match="latency"):
        store.put_ops(1, 1, "cpu", 0, {"A": -1.0})


def test_default_store_lives_in_faas_gpu_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path))
    assert profiles_db() == tmp_path.resolve() / "profiles.db"


def test_missing_profile_names_the_model_and_the_command(store):
    p = LatencyPredictor(store)
    with pytest.raises(MissingProfile) as exc:
        p.predict_ms("resnet-x", 1, 1)
    msg = str(exc.value)
    assert msg.startswith("no profile for model 'resnet-x'") and "faas-gpu profile" in msg and "--name resnet-x" in msg
    assert exc.value.args[0] == msg and exc.value.model == "resnet-x"
    assert isinstance(exc.value, LookupError)
    with pytest.raises(MissingProfile, match="resnet-x"):
        p.configs("resnet-x")
    assert not p.has("resnet-x")


def test_fallback_order_operators_then_measured_then_infless(store, infless_dir):
    store.put_graph("mini", FORK)
    store.put_ops(1, 2, "cpu", 0, OPS)  # (1) operators at batch 1, 2 threads
    store.put_ops(4, 2, "cpu", 0, {k: v for k, v in OPS.items() if k != "B"})  # incomplete at batch 4
    store.put_model("mini", 1, 2, "cpu", 0, 99.0)  # (2) measured, shadowed by the operators
    store.put_model("mini", 4, 2, "cpu", 0, 40.0)
    p = LatencyPredictor(store, offset=0.10, infless_dir=infless_dir)

    assert p.estimate("mini", 1, 2).source == "operators"
    assert p.predict_ms("mini", 1, 2) == pytest.approx(sum(OPS.values()) * 1.10)
    assert p.estimate("mini", 4, 2).source == "measured"
    assert p.predict_ms("mini", 4, 2) == 40.0  # measured: no offset
    assert p.estimate("mini", 1, 4).source == "infless"
    assert p.predict_ms("mini", 1, 4) == 20.0
    assert p.predict_ms("mini", 1, 2, gpu_share=20) == 12.0
    with pytest.raises(MissingProfile, match=r"'mini' at batch 8, 2 CPU threads"):  # 9999 = infeasible
        p.predict_ms("mini", 8, 2)
    with pytest.raises(MissingProfile):
        LatencyPredictor(store).predict_ms("mini", 1, 4)  # no INFless folder: nothing else knows it


def test_concurrent_graphs_combine_with_the_max_rule(store):
    store.put_graph("par", OpGraph(FORK.nodes, concurrent_branches=True))
    store.put_ops(1, 1, "cpu", 0, OPS)
    assert LatencyPredictor(store, offset=0).predict_ms("par", 1, 1) == 1.0 + 4.0 + 1.0


def test_configs_lists_every_source_and_keeps_gpu_rows_for_gpu_nodes(store, infless_dir):
    store.put_graph("mini", FORK)
    store.put_ops(1, 2, "cpu", 0, OPS)
    store.put_ops(2, 1, "cuda", 100, OPS)
    store.put_model("mini", 16, 2, "cpu", 0, 70.0)
    p = LatencyPredictor(store, offset=0.0, infless_dir=infless_dir)
    cpu = p.configs("mini")
    assert cpu == [(1, 2, 0, 8.0), (1, 4, 0, 20.0), (4, 2, 0, 50.5), (16, 2, 0, 70.0)]
    assert set(p.configs("mini", gpu=True)) == {*cpu, (1, 2, 20, 12.0), (2, 1, 100, 8.0)}
    assert p.has("mini") and not p.has("other")  # other's only row is infeasible


def test_infless_files_parse_and_bad_rows_are_named(infless_dir):
    prof = load_infless_profiles(infless_dir)
    assert prof["mini"] == {(2, 0, 1): 30.0, (2, 0, 4): 50.5, (2, 20, 1): 12.0, (4, 0, 1): 20.0}
    assert prof["other"] == {}
    (infless_dir / "bad-profile-results.txt").write_text("bad 2 0 1 3.0\nbad two 0 1 3.0\n")
    with pytest.raises(ValueError, match="bad-profile-results.txt line 2"):
        load_infless_profiles(infless_dir)
    with pytest.raises(FileNotFoundError, match="INFless"):
        load_infless_profiles(infless_dir / "absent")


def tiny(width: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 8)).eval()


def test_prediction_grows_with_batch(store):
    profile_model(store, "tiny", tiny(256), (32,), batches=[1, 512], threads=[1], repeat=5, warmup=1, on=["cpu"])
    p = LatencyPredictor(store)
    assert p.predict_ms("tiny", 512, 1) > p.predict_ms("tiny", 1, 1)
    assert [c[0] for c in p.configs("tiny")] == [1, 512]
    rep = error_report(store, "tiny")
    assert len(rep.rows) == 2 and all(r.predicted_ms > 0 and r.measured_ms > 0 for r in rep.rows)


def test_a_model_made_of_profiled_operators_needs_no_new_measurement(store, monkeypatch):
    first = profile_model(store, "a", tiny(), (32,), batches=[1, 4], threads=[1], repeat=3, warmup=1, on=["cpu"])
    assert first.measured_op_configs == 2
    ops_before = sqlite3.connect(store.path).execute("SELECT * FROM op_profiles ORDER BY 1, 2").fetchall()

    # B: another model (other weights, one more ReLU) built only from A's operators
    b = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.ReLU(), nn.Linear(64, 8)).eval()
    register_model(store, "b", b, (32,))
    p = LatencyPredictor(store, offset=0.0)
    assert p.estimate("b", 4, 1).source == "operators"
    relu = next(sig for sig in store.graph("a").signatures if sig.startswith("ReLU"))
    assert p.predict_ms("b", 4, 1) == pytest.approx(p.predict_ms("a", 4, 1) + store.op_ms(relu, 4, 1))

    import faas_gpu.profiling.operators as ops_mod

    calls = []
    real = ops_mod.measure
    monkeypatch.setattr(ops_mod, "measure", lambda *a, **k: calls.append(k) or real(*a, **k))
    again = profile_model(store, "b", b, (32,), batches=[1, 4], threads=[1], repeat=3, warmup=1, on=["cpu"])
    assert again.measured_op_configs == 0 and again.reused_op_configs == 2
    assert all(k["ops"] is False for k in calls)  # only the whole model was timed
    assert sqlite3.connect(store.path).execute("SELECT * FROM op_profiles ORDER BY 1, 2").fetchall() == ops_before

    c = nn.Sequential(nn.Linear(32, 64), nn.Sigmoid(), nn.Linear(64, 8)).eval()  # Sigmoid is new
    third = profile_model(store, "c", c, (32,), batches=[1], threads=[1], repeat=3, warmup=1, on=["cpu"])
    assert third.measured_op_configs == 1  # one operator is new: that configuration is timed


def test_a_new_model_under_an_old_name_drops_the_old_measurements(store):
    profile_model(store, "m", tiny(), (32,), batches=[1, 2], threads=[1], repeat=1, warmup=0, on=["cpu"])
    other = nn.Sequential(nn.Linear(32, 8)).eval()
    profile_model(store, "m", other, (32,), batches=[1], threads=[1], repeat=1, warmup=0, on=["cpu"])
    assert [c[:3] for c in LatencyPredictor(store).configs("m")] == [(1, 1, 0)]
    assert store.model_profiles("m").keys() == {(1, 1, "cpu", 0)}


# -- a machine too busy to profile: what the report says and what is stored --------------------
def _report(rows):
    from faas_gpu.profiling.report import ErrorReport, ReportRow

    return ErrorReport("resnet-mini", [ReportRow(b, t, "cpu", 0, p, m, s) for b, t, p, m, s in rows])


def test_spread_is_the_interquartile_range_over_the_median():
    from faas_gpu.profiling.report import spread

    assert spread([10.0, 10.0, 10.0, 10.0, 10.0]) == 0.0
    assert spread([9.0, 10.0, 10.0, 10.0, 11.0]) == 0.0  # one outlier each side: the median's neighbours hold
    assert spread([5.0, 8.0, 10.0, 30.0, 60.0]) == pytest.approx((30.0 - 8.0) / 10.0)
    assert spread([7.0]) == 0.0


def test_measurements_with_a_big_spread_are_reported_noisy_with_what_to_do():
    from faas_gpu.profiling.report import noise_verdict

    rows = [(1, 1, 1.1, 1.0, 0.04), (8, 1, 4.0, 4.2, 0.9), (32, 2, 14.0, 15.0, 2.5)]
    report = _report(rows)
    verdict = noise_verdict(
        report, {(b, t, "cpu", 0): s for b, t, _, _, s in rows}, 0.3, "faas-gpu profile -f s.yml fn"
    )
    assert verdict.noisy
    text = verdict.message
    assert text.startswith("resnet-mini: this machine was too busy to profile")
    assert "2 of 3 configurations varied by more than 30%" in text and "worst 250% at batch 32, 2 threads, cpu" in text
    assert "`faas-gpu profile -f s.yml fn --remeasure` when the machine is idle" in text and "--repeat 20" in text
    table = report.table()
    assert "spread" in table.splitlines()[0] and "250.0%" in table
    assert "repeats spread by 90.0% (median), 250.0% at most" in table.splitlines()[-1]


def test_a_prediction_off_by_10x_is_noisy_even_when_each_configuration_repeated_steadily():
    from faas_gpu.profiling.report import noise_verdict

    report = _report([(1, 1, 1.0, 1.05, 0.02), (32, 1, 126.2, 10.0, 0.05)])  # the 1262% row
    verdict = noise_verdict(report, {(1, 1, "cpu", 0): 0.02, (32, 1, "cpu", 0): 0.05})
    assert verdict.noisy and "1 of 2 predictions are off by more than 100% (worst 1162% at batch 32" in verdict.message


def test_quiet_measurements_are_not_noisy():
    from faas_gpu.profiling.report import noise_verdict

    report = _report([(1, 1, 1.0, 1.1, 0.03), (8, 1, 4.0, 3.6, 0.08)])
    verdict = noise_verdict(report, {(1, 1, "cpu", 0): 0.03, (8, 1, "cpu", 0): 0.08})
    assert not verdict.noisy and verdict.message == ""


def _fake_measure(spread_of):
    """measure() as a busy (or quiet) machine gives it: fabricated samples, no clock."""

    def measure(gm, module, x, repeat, warmup, device="cpu", ops=True, whole=True, samples_out=None):
        b = x.shape[0]
        wide = spread_of(b)
        runs = [1.0 * b, 1.0 * b, (1.0 + wide) * b, (1.0 + 2 * wide) * b, (1.0 + 3 * wide) * b]
        if samples_out is not None:
            samples_out["whole"], samples_out["ops"] = runs, runs
        nodes = [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
        return ({n: runs[2] / len(nodes) for n in nodes} if ops else {}), runs[2]

    return measure


def test_a_noisy_run_keeps_a_clean_profile_and_stores_one_marked_noisy_when_there_is_none(store, monkeypatch):
    import faas_gpu.profiling.operators as ops_mod

    kw = dict(batches=[1, 4], threads=[1], repeat=5, warmup=0, on=["cpu"], max_spread=0.3, retries=1)
    monkeypatch.setattr(ops_mod, "measure", _fake_measure(lambda b: 0.01))
    quiet = profile_model(store, "m", tiny(), (32,), **kw)
    assert not quiet.noisy and quiet.stored and store.noisy("m") is None
    clean = store.model_profiles("m")

    calls = []
    busy = _fake_measure(lambda b: 2.0)
    monkeypatch.setattr(ops_mod, "measure", lambda *a, **k: calls.append(1) or busy(*a, **k))
    noisy = profile_model(store, "m", tiny(), (32,), remeasure=True, **kw)
    assert len(calls) == 4  # each configuration measured again once (retries=1)
    assert noisy.noisy and not noisy.stored and "too busy to profile" in noisy.verdict
    assert store.model_profiles("m") == clean and store.noisy("m") is None  # the clean profile stays

    first = profile_model(store, "n", tiny(), (32,), **kw)  # no profile yet: stored, marked
    assert first.noisy and first.stored and store.model_profiles("n")
    assert "too busy to profile" in store.noisy("n")
    monkeypatch.setattr(ops_mod, "measure", _fake_measure(lambda b: 0.01))
    again = profile_model(store, "n", tiny(), (32,), remeasure=True, **kw)  # what `up` does next time
    assert again.stored and store.noisy("n") is None


def test_preferring_measurements_puts_the_whole_models_time_before_the_operators_sum(store, infless_dir):
    """What the planner uses: where the model was timed end to end at a configuration, that time;
    the operators' sum only where it was not (and INFless's files after both)."""
    store.put_graph("mini", FORK)
    store.put_ops(1, 2, "cpu", 0, OPS)
    store.put_ops(4, 2, "cpu", 0, OPS)
    store.put_model("mini", 1, 2, "cpu", 0, 99.0)  # measured at batch 1 only
    p = LatencyPredictor(store, offset=0.10, infless_dir=infless_dir, prefer_measured=True)
    assert p.estimate("mini", 1, 2) == Estimate(99.0, "measured")
    assert p.estimate("mini", 4, 2).source == "operators"
    assert p.estimate("mini", 1, 4).source == "infless"
    configs = {(b, c, g): ms for b, c, g, ms in p.configs("mini")}
    assert configs[(1, 2, 0)] == 99.0 and configs[(4, 2, 0)] == pytest.approx(sum(OPS.values()) * 1.10)
    # the default keeps INFless's order: the operators shadow the measurement
    assert LatencyPredictor(store, offset=0.10).estimate("mini", 1, 2).source == "operators"
