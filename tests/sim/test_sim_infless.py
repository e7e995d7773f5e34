"""The INFless reproduction's loaders and simulator on small fixture files (CI has no shared data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from faas_gpu.policies.infless import FixedKeepAlive, HybridHistogram, LongShortTermHistogram, Server
from faas_gpu.sim.infless import (
    Function,
    Simulation,
    max_sustained,
    pattern_loads,
    replay_keepalive,
    schedule_cost,
    simulate,
)
from faas_gpu.sim.infless_data import (
    ProfileRow,
    active_minutes,
    candidates,
    data_dir,
    load_azure_minutes,
    load_cluster,
    load_pattern,
    load_profiles,
    node_servers,
    slot_servers,
)

TOY = """toy 2 0 1 100
toy 2 10 1 40
toy 2 10 4 60
toy 4 20 4 45
toy 2 10 8 9500
"""
CLUSTER = """version: 1.0
cluster-capacity:
  - node-label: kubernetes.io/hostname=node-a
    gpu-capacity:
      - cuda-device: -1
        gpu-memory: 11019
      - cuda-device: 0
        gpu-memory: 11019
      - cuda-device: 1
        gpu-memory: 11019
    cpu-capacity:
      - cpu-socket: 1
        socket-core:
          - cpu-core-index: 10
          - cpu-core-index: 11
      - cpu-socket: 2
        socket-core:
          - cpu-core-index: 20
          - cpu-core-index: 21
          - cpu-core-index: 22
"""


@pytest.fixture
def data(tmp_path: Path) -> Path:
    (tmp_path / "profiler").mkdir()
    (tmp_path / "profiler" / "toy-profile-results.txt").write_text(TOY)
    (tmp_path / "workload" / "azure_7day_per_minute").mkdir(parents=True)
    (tmp_path / "workload" / "azure_7day_per_minute" / "1.txt").write_text("0\n3\n0\n1\n")
    (tmp_path / "workload" / "Bursty.txt").write_text("5\n5.70000000000000\n0\n14.3\n")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "clusterCapConfig-dev.yml").write_text(CLUSTER)
    return tmp_path


def toy(data: Path, slo_s: float = 0.2) -> Function:
    return Function("toy", slo_s, tuple(load_profiles(data)["toy"]))


def test_loaders_read_the_published_formats(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = load_profiles(data)["toy"]
    assert rows[0] == ProfileRow(2, 0, 1, 100.0) and len(rows) == 5 and not rows[-1].feasible
    cands = candidates(rows)  # the infeasible row goes; latencies x 1.10, in seconds
    assert len(cands) == 4 and cands[0].t_exec_s == pytest.approx(0.110)
    assert {c.batch for c in candidates(rows, batches={1})} == {1}
    assert all(c.gpu > 0 for c in candidates(rows, gpu_only=True))
    assert load_azure_minutes(1, data) == [0, 3, 0, 1] and active_minutes([0, 3, 0, 1]) == [1, 3]
    assert load_pattern("Bursty", data) == [5.0, 5.7, 0.0, 14.3]
    (node,) = load_cluster(data)
    assert node.name == "node-a" and node.socket_threads == (4, 6) and len(node.gpu_memory_mb) == 2
    assert [(s.name, s.cpu_free, s.gpus_free) for s in slot_servers([node])] == [
        ("node-a/s0", 4.0, [100.0]),
        ("node-a/s1", 6.0, [100.0]),
    ]
    assert node_servers([node])[0].cpu_free == 10.0
    monkeypatch.setenv("FAAS_GPU_INFLESS_DATA", str(data))
    assert data_dir() == data and data_dir("/x") == Path("/x")
    with pytest.raises(ValueError, match="Sporadic"):
        load_pattern("Weekly", data)


def test_profile_rows_are_checked(tmp_path: Path) -> None:
    (tmp_path / "profiler").mkdir()
    (tmp_path / "profiler" / "bad-profile-results.txt").write_text("bad 2 10 1\n")
    with pytest.raises(ValueError, match="line 1"):
        load_profiles(tmp_path)


def test_pattern_loads_scale_the_peak_and_hold_each_point() -> None:
    loads = pattern_loads([1.0, 4.0, 2.0], peak_rps=100.0, hold_s=3)
    assert loads == [25.0] * 3 + [100.0] * 3 + [50.0] * 3
    assert len(pattern_loads([1.0, 4.0, 2.0], 10.0, hold_s=2, points=2)) == 4


SERVERS = [Server("s0", 20.0, [100.0]), Server("s1", 20.0, [100.0])]


def test_infless_uses_several_batch_sizes_under_a_changing_load(data: Path) -> None:
    fn = toy(data)
    load = [5.0] * 15 + [200.0] * 30
    r = simulate([fn], {"toy": load}, SERVERS, "INFless")
    # 5 RPS cannot fill a batch of 4 before its timeout (r_low = 32): batch 1; 200 RPS: batches of 4 first
    assert r.batches_used("toy") == {1, 4}
    assert (1, 2.0, 0.0) in r.fns["toy"].configs  # the CPU-only configuration is the densest batch-1 one
    assert r.slo_violation < 0.15 and r.total("good") > 0


def test_openfaas_plus_uses_batch_one_on_two_threads_and_ten_percent(data: Path) -> None:
    fn = toy(data)
    r = simulate([fn], {"toy": [5.0] * 15 + [200.0] * 30}, SERVERS, "OpenFaaS+")
    assert r.batches_used("toy") == {1}
    assert r.fns["toy"].configs == {(1, 2.0, 10.0)}


def test_batch_keeps_one_gpu_configuration_at_a_constant_load(data: Path) -> None:
    fn = toy(data)
    r = simulate([fn], {"toy": [200.0] * 30}, SERVERS, "BATCH", measure_from=10)
    assert len(r.fns["toy"].configs) == 1
    (cfg,) = r.fns["toy"].configs
    assert cfg[2] > 0  # an OTP system never switches to the CPU
    assert r.slo_violation == 0.0


def test_stress_finds_the_cluster_capacity_of_openfaas_plus(data: Path) -> None:
    # 2 threads + 10% per instance, 40 ms: 25 RPS each, 10 instances per 20-thread slot, 2 slots
    point = max_sustained([toy(data)], SERVERS, "OpenFaaS+")
    assert 495.0 <= point.rps_per_fn <= 500.0
    assert point.result.slo_violation == 0.0


def test_cold_start_requests_are_counted(data: Path) -> None:
    r = Simulation([toy(data)], {"toy": [10.0] * 10}, SERVERS, "OpenFaaS+", cold_start_s=3.0).run()
    # step 0: nothing measured yet; step 1 starts an instance, warm at step 4: steps 0-3 wait
    assert r.total("cold") == pytest.approx(40.0)
    assert r.slo_violation == pytest.approx(0.4)


def test_keepalive_replay_counts_cold_starts_and_waste() -> None:
    counts = [0] * 31
    for m in (0, 10, 12, 30):
        counts[m] = 1
    # HHP has fewer than 10 idle times: its default keeps the image for its whole 4 h range
    # (after minute 30, the trace's last, nothing is counted: the trace shows no waste past its end)
    hhp = replay_keepalive(counts, HybridHistogram())
    assert (hhp.cold_starts, hhp.wasted_minutes) == (1, 9 + 1 + 17 + 0)
    # LSTH reads the one idle time (10 min) at once: pre-warm 9 min, so minute 12 is cold; at 12 the
    # idle times [2, 10] give [13, 23], so minute 30 is cold too
    lsth = replay_keepalive(counts, LongShortTermHistogram())
    assert (lsth.cold_starts, lsth.wasted_minutes) == (3, 9 + 0 + 10 + 0)
    fixed = replay_keepalive(counts, FixedKeepAlive(300.0))
    assert (fixed.cold_starts, fixed.wasted_minutes) == (3, 4 + 1 + 4 + 0)
    assert fixed.cold_rate == pytest.approx(3 / 4)


def test_d8_keepalive_waste_is_counted_up_to_the_traces_end() -> None:
    """A 1-minute trace showed 239 minutes of HHP waste (its 4 h default, after the trace)."""
    assert replay_keepalive([5], HybridHistogram()).wasted_minutes == 0
    stats = replay_keepalive([1, 0, 0, 0], FixedKeepAlive(300.0))  # kept to minute 5; the trace ends at 4
    assert stats.wasted_minutes == 3 and stats.minutes == 4  # minutes 1-3: loaded, idle, inside the trace


def test_d8_a_burst_is_one_cold_start_said_and_rated_per_active_minute() -> None:
    """The method counts a minute's invocations as one instance sees them: a burst of 10^6 is one
    cold start. The assumption is printed (`ASSUMED`), and a rate a burst cannot dilute is given."""
    from faas_gpu.sim.infless.keepalive_replay import ASSUMED

    counts = [10**6] + [0] * 9 + [1]
    stats = replay_keepalive(counts, FixedKeepAlive(60.0))
    assert stats.cold_starts == 2 and stats.active_minutes == 2
    assert stats.cold_rate == pytest.approx(2 / (10**6 + 1))
    assert stats.cold_rate_active == 1.0
    assert "a burst of 10^6 in one minute is one cold start" in ASSUMED


def test_schedule_cost_reports_per_instance_figures(data: Path) -> None:
    ticks = iter(range(10_000))
    fns = [toy(data), Function("toy-b", 0.3, toy(data).rows)]
    servers = [Server(f"n{i}", 20.0, [100.0, 100.0]) for i in range(5)]
    cost = schedule_cost(fns, servers, 20, clock=lambda: next(ticks) * 0.001)
    assert cost.instances == 20 and cost.servers == 5
    assert cost.seconds == pytest.approx(0.001 * cost.calls)  # every call timed once
    assert cost.ms_per_instance == pytest.approx(cost.seconds * 1000 / 20)
