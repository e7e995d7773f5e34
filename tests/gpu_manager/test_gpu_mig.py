"""MIG geometry control (PROTEAN §4.4's act of slicing a GPU) against a stateful fake NVML.

The fake (tests/fake_nvml.py) keeps the GPU instances and compute instances it is asked to
create, and refuses what a real driver refuses: overlapping or unknown placements, a GPU
instance destroyed before its compute instances, anything while MIG mode is off.
"""

from __future__ import annotations

import threading
import time

import pynvml
import pytest
import torch

from faas_gpu.contract.wire import encode
from faas_gpu.datastore import open_datastore
from faas_gpu.models import ModelStore
from gpu_manager import mig
from gpu_manager.api import create_app
from gpu_manager.daemon import STATUS_PREFIX, StatusReporter
from gpu_manager.discovery import discover_units
from gpu_manager.manager import GPUManager, UnitDraining
from tests.fake_nvml import FakeGPU, MigNVML
from tests.fake_worker import FakeWorker, stored_program

AUTH = {"Authorization": "Bearer t"}
BATCH = encode(torch.zeros(1, 3))


def _profiles(nvml: MigNVML, index: int = 0) -> dict[str, mig.Profile]:
    with mig.nvml_session(nvml):
        return mig.read_profiles(nvml, mig.handle(nvml, index))


def _mig_units(nvml: MigNVML, index: int = 0) -> dict[str, str]:
    """MIG device UUID -> its profile, as discovery sees them."""
    return {u.id: u.name.rsplit(" ", 1)[1] for u in discover_units(nvml) if u.index == index and u.kind == "mig"}


# -- profiles and geometries ----------------------------------------------------------------


def test_profiles_come_from_nvml_with_their_own_ids_and_placements():
    a100 = _profiles(MigNVML([FakeGPU.a100_40gb()]))
    assert list(a100) == ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1g.10gb"]
    p = a100["3g.20gb"]
    assert (p.id, p.nvml_profile, p.slices, p.max_count, p.memory_mb) == (9, "3_SLICE", 3, 2, 20096)
    assert p.placements == ((0, 4), (4, 4))
    # the constant NVML_GPU_INSTANCE_PROFILE_1_SLICE (0) is not the profile id (19) NVML creates
    assert pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE == 0 and a100["1g.5gb"].id == 19 and a100["7g.40gb"].id == 0
    h100 = _profiles(MigNVML([FakeGPU.h100_80gb()]))
    assert {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"} <= set(h100)
    assert _profiles(MigNVML([FakeGPU.a100_40gb(mig=False)])) == {}  # NVML answers nothing with MIG off


def test_valid_geometries_are_the_full_packings_of_the_gpu():
    profiles = _profiles(MigNVML([FakeGPU.a100_40gb()]))
    full = mig.valid_geometries(profiles)
    for g in (["7g.40gb"], ["4g.20gb", "3g.20gb"], ["3g.20gb", "3g.20gb"], ["4g.20gb", "2g.10gb", "1g.5gb"]):
        assert g in full
    assert ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"] in full  # needs the 3g at slice 4, the 2g at 0
    assert ["1g.5gb"] * 7 in full and ["4g.20gb"] not in full  # a 4g alone is not full
    assert all(sum(profiles[n].slices for n in g) <= 7 for g in full)


# -- reaching a geometry --------------------------------------------------------------------


def test_from_empty_to_4g_3g_creates_instances_at_planned_placements():
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    assert mig.apply_geometry(nvml, 0, ["3g.20gb", "4g.20gb"]) == ["4g.20gb", "3g.20gb"]
    assert gpu.layout() == [("4g.20gb", 0, 1), ("3g.20gb", 4, 1)]  # each with one compute instance
    assert [e[0] for e in nvml.log] == ["create_gi", "create_ci", "create_gi", "create_ci"]
    assert sorted(_mig_units(nvml).values()) == ["3g.20gb", "4g.20gb"]
    assert {u.memory_mb for u in discover_units(nvml)} == {20096}
    assert nvml.inits == 0  # every nvmlInit has its nvmlShutdown


def test_from_another_geometry_keeps_what_it_can_and_destroys_in_a_safe_order():
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("3g.20gb", 0), ("3g.20gb", 4)])
    before = _mig_units(nvml)
    right = next(u for u, d in zip(before, gpu.mig_devices(), strict=True) if d.gi.start == 4)
    # only a 3g at slice 4 leaves room for 2g + 1g + 1g: the planner keeps that one
    geometry = mig.apply_geometry(nvml, 0, ["1g.5gb", "2g.10gb", "3g.20gb", "1g.5gb"])
    assert geometry == ["2g.10gb", "1g.5gb", "1g.5gb", "3g.20gb"]
    assert gpu.layout() == [("2g.10gb", 0, 1), ("1g.5gb", 2, 1), ("1g.5gb", 3, 1), ("3g.20gb", 4, 1)]
    after = _mig_units(nvml)
    assert right in after and len(after) == 4  # the kept slice is the same MIG device
    kinds = [e[0] for e in nvml.log]
    assert kinds[:2] == ["destroy_ci", "destroy_gi"] and nvml.log[1][2:] == ("3g.20gb", 0)
    assert "destroy_ci" not in kinds[2:] and "destroy_gi" not in kinds[2:]  # all destroys first


def test_h100_into_seven_slices_and_back():
    gpu = FakeGPU.h100_80gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("7g.80gb", 0)])
    mig.apply_geometry(nvml, 0, ["1g.10gb"] * 7)
    assert gpu.geometry() == ["1g.10gb"] * 7
    assert [u.memory_mb for u in discover_units(nvml)] == [9984] * 7
    mig.apply_geometry(nvml, 0, ["4g.40gb", "3g.40gb"])
    assert gpu.layout() == [("4g.40gb", 0, 1), ("3g.40gb", 4, 1)]
    mig.apply_geometry(nvml, 0, [])  # an empty geometry: no instance at all
    assert gpu.gis == {}


def test_the_same_geometry_changes_nothing_and_a_bare_instance_gets_its_compute_instance():
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    mig.apply_geometry(nvml, 0, ["4g.20gb", "3g.20gb"])
    assert nvml.log == []
    bare = FakeGPU.a100_40gb()
    nvml = MigNVML([bare])
    nvml.preset(bare, [("7g.40gb", 0)], compute=False)
    assert discover_units(nvml) == []  # a GPU instance without a compute instance is no device
    mig.apply_geometry(nvml, 0, ["7g.40gb"])
    assert [e[0] for e in nvml.log] == ["create_ci"] and len(discover_units(nvml)) == 1


def test_an_odd_compute_layout_is_rebuilt_as_one_full_slice():
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("3g.20gb", 0)], compute=False)
    nvml.nvmlInit()
    gi = nvml._ptr(pynvml.c_nvmlGpuInstance_t, gpu.gis[1].handle)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    nvml.nvmlShutdown()
    nvml.log.clear()
    mig.apply_geometry(nvml, 0, ["3g.20gb"])
    assert [e[0] for e in nvml.log] == ["destroy_ci", "destroy_ci", "destroy_gi", "create_gi", "create_ci"]
    assert gpu.layout() == [("3g.20gb", 0, 1)]


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, reason",
    [
        (["4g.20gb", "4g.20gb"], "too many instances: 4g.20gb x2 (at most 1)"),
        (["4g.20gb", "3g.20gb", "1g.5gb"], "do not fit together"),
        (["5g.30gb"], "unknown profile(s) '5g.30gb'"),
        (["2g.10gb"] * 3 + ["1g.10gb", "1g.5gb"], "do not fit together"),
    ],
)
def test_an_invalid_geometry_is_refused_with_the_valid_ones_and_nothing_changes(target, reason):
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("7g.40gb", 0)])
    with pytest.raises(mig.InvalidGeometry) as err:
        mig.apply_geometry(nvml, 0, target)
    assert isinstance(err.value, ValueError)
    message = str(err.value)
    assert reason in message and "4g.20gb (up to 1)" in message and "1g.5gb (up to 7)" in message
    assert "[4g.20gb, 3g.20gb]" in message
    assert err.value.valid_profiles["3g.20gb"] == 2 and ["7g.40gb"] in err.value.valid_geometries
    assert nvml.log == [] and gpu.geometry() == ["7g.40gb"]


def test_mig_mode_off_is_refused_and_left_off():
    off = FakeGPU.a100_40gb(mig=False)
    plain = FakeGPU("NVIDIA GeForce RTX 4090", 24564, mig=None)  # not MIG-capable
    nvml = MigNVML([off, plain])
    with pytest.raises(mig.MigModeOff, match="gpu 0: MIG mode is off.*never changes it"):
        mig.apply_geometry(nvml, 0, ["7g.40gb"])
    with pytest.raises(mig.MigModeOff, match="gpu 1: not MIG-capable"):
        mig.apply_geometry(nvml, 1, ["7g.40gb"])
    with pytest.raises(mig.UnknownGPU):
        mig.apply_geometry(nvml, 2, [])
    assert off.mig_mode == pynvml.NVML_DEVICE_MIG_DISABLE and nvml.log == []  # no nvmlDeviceSetMigMode


def test_busy_units_or_processes_refuse_before_anything_is_destroyed():
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    with pytest.raises(mig.UnitsBusy, match="units still busy, not drained: MIG-a"):
        mig.apply_geometry(nvml, 0, ["7g.40gb"], busy=lambda: ["MIG-a"])
    gpu.mig_devices()[1].ci.processes.append(4242)  # someone else's CUDA process on the 3g
    with pytest.raises(mig.UnitsBusy, match="pids 4242"):
        mig.apply_geometry(nvml, 0, ["7g.40gb"], settle_s=0)
    assert nvml.log == [] and gpu.geometry() == ["4g.20gb", "3g.20gb"]
    # a geometry that keeps the 3g in use (and replaces only the idle 4g) is fine
    mig.apply_geometry(nvml, 0, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], settle_s=0)
    assert gpu.geometry() == ["2g.10gb", "1g.5gb", "1g.5gb", "3g.20gb"]
    assert 4242 in gpu.mig_devices()[-1].ci.processes


def test_an_nvml_failure_half_way_names_the_step():
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])

    def refuse(*_args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    nvml.nvmlDeviceCreateGpuInstanceWithPlacement = refuse
    with pytest.raises(mig.MigError, match="creating 4g.20gb at slice 0 failed: NVMLError_InsufficientResources"):
        mig.apply_geometry(nvml, 0, ["4g.20gb", "3g.20gb"])
    assert nvml.inits == 0


def test_mps_clients_count_as_busy_and_an_unreadable_process_list_is_not_idle():
    """NVML lists MPS clients apart (nvmlDeviceGetMPSComputeRunningProcesses); a list NVML will
    not show (NO_PERMISSION) refuses the change: nothing says the instance is idle."""
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    gpu.mig_devices()[1].ci.mps_processes.append(5151)
    with pytest.raises(mig.UnitsBusy, match="pids 5151"):
        mig.apply_geometry(nvml, 0, ["7g.40gb"], settle_s=0)
    gpu.mig_devices()[1].ci.mps_processes.clear()
    nvml.can_list_processes = False
    with pytest.raises(mig.MigNotPermitted, match="no permission to see its processes"):
        mig.apply_geometry(nvml, 0, ["7g.40gb"], settle_s=0)
    assert nvml.log == [] and gpu.geometry() == ["4g.20gb", "3g.20gb"]


def test_without_privilege_nvml_refuses_create_and_destroy():
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu], privileged=False)
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    with pytest.raises(mig.MigNotPermitted, match="NVML_ERROR_NO_PERMISSION"):
        mig.apply_geometry(nvml, 0, ["7g.40gb"], settle_s=0)
    assert nvml.log == [] and gpu.layout() == [("4g.20gb", 0, 1), ("3g.20gb", 4, 1)]
    assert nvml.inits == 0


def test_a_destroy_in_use_with_no_process_is_undone_so_no_unit_vanishes():
    """DCGM holding a handle: the 3g's compute instance goes, then its GPU instance is refused
    IN_USE. The 4g already destroyed is created again and the 3g gets its compute instance back."""
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    next(g for g in gpu.gis.values() if g.start == 4).held = True
    with pytest.raises(mig.InstancesInUse, match="IN_USE with no process visible") as exc:
        mig.apply_geometry(nvml, 0, ["7g.40gb"], settle_s=0)
    assert "restored 3g.20gb's compute instance, 4g.20gb at slice 0" in str(exc.value)
    assert exc.value.retry_after_s > 0
    assert gpu.layout() == [("4g.20gb", 0, 1), ("3g.20gb", 4, 1)]  # every unit there again
    assert [e[0] for e in nvml.log] == ["destroy_ci", "destroy_gi", "destroy_ci", "create_ci", "create_gi", "create_ci"]
    assert len(discover_units(nvml)) == 2


def test_describe_gpus():
    a100, off = FakeGPU.a100_40gb(), FakeGPU.h100_80gb(mig=False)
    nvml = MigNVML([a100, off])
    nvml.preset(a100, [("4g.20gb", 0), ("2g.10gb", 4)])
    gpus = mig.describe_gpus(nvml)
    assert [g["mig_mode"] for g in gpus] == ["enabled", "disabled"]
    assert gpus[0]["geometry"] == ["4g.20gb", "2g.10gb"]
    assert gpus[0]["instances"][1] == {
        "id": 2,
        "profile": "2g.10gb",
        "placement": {"start": 4, "size": 2},
        "compute_instances": [2],
    }
    assert gpus[0]["profiles"][0]["name"] == "7g.40gb" and gpus[1]["profiles"] == []
    assert mig.describe_gpus(MigNVML([], driver=False)) == []


# -- the manager and its API ----------------------------------------------------------------


@pytest.fixture
def node(tmp_path):
    """An A100 sliced (4g, 3g) and an H100 with MIG off, a manager over them, and its API."""
    a100, h100 = FakeGPU.a100_40gb(), FakeGPU.h100_80gb(mig=False)
    nvml = MigNVML([a100, h100])
    nvml.preset(a100, [("4g.20gb", 0), ("3g.20gb", 4)])
    store = ModelStore(tmp_path / "models")
    gate = threading.Event()
    mgr = GPUManager(
        discover_units(nvml),
        store,
        worker_factory=lambda a, d, env=None: FakeWorker(a, d, env, gate),
        nvml=nvml,
    )
    digest = stored_program(store, "m1")
    yield mgr, nvml, a100, h100, create_app(mgr, "t").test_client(), digest, gate
    gate.set()
    mgr.close()


def _wait(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _unit(mgr: GPUManager, profile: str) -> str:
    return next(s.info.id for s in mgr.units.values() if s.info.name.endswith(profile))


def test_get_gpus_lists_mode_geometry_profiles_and_units(node):
    mgr, _, a100, h100, client, _, _ = node
    assert client.get("/v1/gpus").status_code == 401
    gpus = client.get("/v1/gpus", headers=AUTH).get_json()
    assert [(g["index"], g["mig_mode"], g["geometry"]) for g in gpus] == [
        (0, "enabled", ["4g.20gb", "3g.20gb"]),
        (1, "disabled", []),
    ]
    assert gpus[0]["uuid"] == a100.uuid and sorted(gpus[0]["units"]) == sorted(_mig_units(mgr.nvml))
    assert {p["name"]: p["max_count"] for p in gpus[0]["profiles"]}["2g.10gb"] == 3
    assert gpus[1]["units"] == [h100.uuid] and gpus[1]["profiles"] == []  # MIG off: the whole GPU is a unit
    assert gpus[0]["mps"] is False


def test_post_geometry_reslices_the_gpu_and_reports_the_new_units(node, tmp_path):
    mgr, nvml, a100, _, client, digest, gate = node
    gate.set()
    ds = open_datastore(None, tmp_path / "state.db")
    reporter = StatusReporter(mgr, ds, "n1", "http://x")
    mgr.on_units_changed.append(reporter.report)
    reporter.report()
    old = sorted(mgr.units)
    assert sorted(kv.key.rsplit("/", 1)[1] for kv in ds.get_prefix(STATUS_PREFIX)) == old
    four_g = _unit(mgr, "4g.20gb")
    assert client.post(f"/v1/jobs/{digest}?unit={four_g}", data=BATCH, headers=AUTH).status_code == 200
    worker = FakeWorker.made[-1]
    assert worker.device == "cuda:0" and worker.env == {"CUDA_VISIBLE_DEVICES": four_g}

    body = {"profiles": ["4g.20gb", "2g.10gb", "1g.5gb"]}
    assert client.post("/v1/gpus/0/geometry", json=body).status_code == 401
    r = client.post("/v1/gpus/0/geometry", json=body, headers=AUTH)
    assert r.status_code == 200, r.get_data(as_text=True)
    out = r.get_json()
    assert out["gpu"] == 0 and out["geometry"] == ["4g.20gb", "2g.10gb", "1g.5gb"]
    assert a100.geometry() == ["4g.20gb", "2g.10gb", "1g.5gb"]
    names = sorted(u["name"].rsplit(" ", 1)[1] for u in out["units"])
    assert names == ["1g.5gb", "2g.10gb", "4g.20gb"]
    assert all(u["state"] == "idle" and u["models"] == [] for u in out["units"])
    assert not worker.alive  # drained: its worker stopped
    assert four_g in mgr.units  # the 4g was kept: the same MIG device, serving again
    new = sorted(mgr.units)
    assert sorted(kv.key.rsplit("/", 1)[1] for kv in ds.get_prefix(STATUS_PREFIX)) == new
    gone = next(u for u in old if u not in new)
    r = client.post(f"/v1/jobs/{digest}?unit={gone}", data=BATCH, headers=AUTH)
    assert r.status_code == 404 and "not a unit of this node" in r.get_data(as_text=True)
    assert mgr.run(digest, _unit(mgr, "1g.5gb"), b"y").payload == b"y"
    ds.close()


def test_post_geometry_answers_400_with_the_valid_geometries(node):
    mgr, nvml, a100, _, client, _, _ = node
    r = client.post("/v1/gpus/0/geometry", json={"profiles": ["4g.20gb", "4g.20gb"]}, headers=AUTH)
    assert r.status_code == 400
    body = r.get_json()
    assert "too many instances" in body["error"] and body["valid_profiles"]["4g.20gb"] == 1
    assert ["4g.20gb", "3g.20gb"] in body["valid_geometries"]
    for bad in ({}, {"profiles": "7g.40gb"}, {"profiles": [7]}, {"profiles": [], "drain_timeout_s": -1}):
        assert client.post("/v1/gpus/0/geometry", json=bad, headers=AUTH).status_code == 400
    deep = b"[" * 100_000 + b"]" * 100_000
    r = client.post("/v1/gpus/0/geometry", data=deep, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400
    assert nvml.log == [] and a100.geometry() == ["4g.20gb", "3g.20gb"]
    assert all(s.draining is False for s in mgr.units.values())


def test_post_geometry_refuses_mig_off_409_and_unknown_gpu_404(node):
    _, nvml, _, h100, client, _, _ = node
    r = client.post("/v1/gpus/1/geometry", json={"profiles": ["7g.80gb"]}, headers=AUTH)
    assert r.status_code == 409 and "MIG mode is off" in r.get_data(as_text=True)
    assert h100.mig_mode == pynvml.NVML_DEVICE_MIG_DISABLE and nvml.log == []
    assert client.post("/v1/gpus/7/geometry", json={"profiles": []}, headers=AUTH).status_code == 404


def test_busy_units_answer_409_and_serve_on(node):
    mgr, nvml, a100, _, client, digest, gate = node
    three_g = _unit(mgr, "3g.20gb")
    result = {}
    job = threading.Thread(target=lambda: result.update(r=mgr.run(digest, three_g, b"j")))
    job.start()
    _wait(lambda: mgr.units[three_g].busy_since is not None)
    r = client.post("/v1/gpus/0/geometry", json={"profiles": ["7g.40gb"], "drain_timeout_s": 0.2}, headers=AUTH)
    assert r.status_code == 409 and three_g in r.get_data(as_text=True)
    assert nvml.log == [] and a100.geometry() == ["4g.20gb", "3g.20gb"]
    assert {u["unit"]: u["state"] for u in mgr.status()}[three_g] == "busy"  # not draining any more
    gate.set()
    job.join(5)
    assert result["r"].payload == b"j"
    assert mgr.run(digest, _unit(mgr, "4g.20gb"), b"k").payload == b"k"


def test_a_reconfiguration_waits_for_the_running_job_and_turns_new_jobs_away(node):
    mgr, nvml, a100, _, client, digest, gate = node
    three_g = _unit(mgr, "3g.20gb")
    result = {}
    job = threading.Thread(target=lambda: result.update(r=mgr.run(digest, three_g, b"j")))
    job.start()
    _wait(lambda: mgr.units[three_g].busy_since is not None)
    answer = {}
    reconf = threading.Thread(target=lambda: answer.update(out=mgr.reconfigure(0, ["7g.40gb"], drain_timeout_s=10)))
    reconf.start()
    _wait(lambda: mgr.units[three_g].draining)
    with pytest.raises(UnitDraining, match="draining"):
        mgr.run(digest, three_g, b"late")
    r = client.post(f"/v1/jobs/{digest}?unit={three_g}", data=BATCH, headers=AUTH)
    assert r.status_code == 503 and "draining for a reconfiguration" in r.get_data(as_text=True)
    assert nvml.log == []  # nothing touched while the job runs
    gate.set()
    job.join(5)
    reconf.join(5)
    assert result["r"].payload == b"j"  # the running job finished
    assert answer["out"]["geometry"] == ["7g.40gb"] and a100.geometry() == ["7g.40gb"]
    assert [u["name"].rsplit(" ", 1)[1] for u in answer["out"]["units"]] == ["7g.40gb"]


def test_reconfiguring_to_the_current_geometry_drains_nothing(node):
    mgr, nvml, _, _, client, digest, _ = node
    mgr.units[_unit(mgr, "3g.20gb")].busy_since = time.monotonic()  # "busy", but nothing changes
    r = client.post("/v1/gpus/0/geometry", json={"profiles": ["3g.20gb", "4g.20gb"]}, headers=AUTH)
    assert r.status_code == 200 and r.get_json()["geometry"] == ["4g.20gb", "3g.20gb"] and nvml.log == []


def test_a_manager_without_gpu_control_has_no_gpus(tmp_path):
    from gpu_manager.discovery import cpu_units

    client = create_app(GPUManager(cpu_units(1, 64), ModelStore(tmp_path)), "t").test_client()
    assert client.get("/v1/gpus", headers=AUTH).get_json() == []
    assert client.post("/v1/gpus/0/geometry", json={"profiles": []}, headers=AUTH).status_code == 404


def test_a_manager_may_start_on_a_mig_gpu_without_instances(tmp_path):
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    mgr = GPUManager(discover_units(nvml), ModelStore(tmp_path), nvml=nvml)
    assert mgr.units == {}
    out = mgr.reconfigure(0, ["3g.20gb", "3g.20gb"])
    assert len(out["units"]) == 2 and len(mgr.units) == 2
    with pytest.raises(ValueError, match="at least one unit"):
        GPUManager([], ModelStore(tmp_path))


def test_a_manager_without_privilege_lists_its_gpus_and_refuses_403_without_draining(tmp_path):
    """Finding 2: not root, no mig-config capability. GET /v1/gpus answers (the MIG-mode GPU's own
    memory is privileged: null; its units' are not), and a reconfiguration is refused before any
    worker stops."""
    a100, h100 = FakeGPU.a100_40gb(reserved_mb=300), FakeGPU.h100_80gb(mig=False, reserved_mb=330)
    nvml = MigNVML([a100, h100], privileged=False)
    nvml.preset(a100, [("4g.20gb", 0), ("3g.20gb", 4)])
    store = ModelStore(tmp_path)
    mgr = GPUManager(discover_units(nvml), store, worker_factory=FakeWorker, nvml=nvml)
    client = create_app(mgr, "t").test_client()
    assert not mgr.privilege.allowed and "not root" in mgr.privilege.reason
    r = client.get("/v1/gpus", headers=AUTH)
    assert r.status_code == 200, r.get_data(as_text=True)
    gpus = r.get_json()
    assert [(g["memory_mb"], g["mig_control"]) for g in gpus] == [(None, False), (81559 - 330, False)]
    assert "mig-config" in gpus[0]["mig_control_reason"] and gpus[0]["geometry"] == ["4g.20gb", "3g.20gb"]

    digest = stored_program(store, "m1")
    four_g = _unit(mgr, "4g.20gb")
    mgr.run(digest, four_g, b"x")
    worker = FakeWorker.made[-1]
    r = client.post("/v1/gpus/0/geometry", json={"profiles": ["7g.40gb"]}, headers=AUTH)
    assert r.status_code == 403 and "cannot be changed by this manager" in r.get_data(as_text=True)
    assert worker.alive and mgr.units[four_g].draining is False and nvml.log == []
    assert (
        client.post("/v1/gpus/0/geometry", json={"profiles": ["4g.20gb", "3g.20gb"]}, headers=AUTH).status_code == 200
    )
    reconf = {k: v for k, v in _scrape(client).items() if k[0] == "faas_gpu_mig_reconfigurations_total"}
    assert list(reconf.values()) == [1] and ("result", "refused") in next(iter(reconf))[1]
    mgr.close()


def test_nvml_refusing_what_the_probe_allowed_is_403_and_not_drained_again(tmp_path):
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu], privileged=False)
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    store = ModelStore(tmp_path)
    allowed = lambda: mig.MigPrivilege(True, "the probe says so")  # noqa: E731
    mgr = GPUManager(discover_units(nvml), store, worker_factory=FakeWorker, nvml=nvml, mig_privilege=allowed)
    client = create_app(mgr, "t").test_client()
    body = {"profiles": ["7g.40gb"]}
    assert client.post("/v1/gpus/0/geometry", json=body, headers=AUTH).status_code == 403
    assert sorted(mgr.units) == sorted(_mig_units(nvml))  # the same units, serving again
    digest = stored_program(store, "m1")
    mgr.run(digest, _unit(mgr, "4g.20gb"), b"x")
    worker = FakeWorker.made[-1]
    assert client.post("/v1/gpus/0/geometry", json=body, headers=AUTH).status_code == 403
    assert worker.alive  # refused before draining this time
    assert client.get("/v1/gpus", headers=AUTH).get_json()[0]["mig_control"] is False
    mgr.close()


def test_an_unreadable_process_list_is_403_before_draining_and_not_remembered(tmp_path):
    """Another user's processes on an instance to destroy: NVML will not list them, so nothing
    says it is idle. Refused before any worker stops; once the list reads again, it proceeds."""
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    store = ModelStore(tmp_path)
    mgr = GPUManager(discover_units(nvml), store, worker_factory=FakeWorker, nvml=nvml)
    client = create_app(mgr, "t").test_client()
    digest = stored_program(store, "m1")
    four_g = _unit(mgr, "4g.20gb")
    mgr.run(digest, four_g, b"x")
    worker = FakeWorker.made[-1]
    nvml.can_list_processes = False
    body = {"profiles": ["7g.40gb"]}
    r = client.post("/v1/gpus/0/geometry", json=body, headers=AUTH)
    assert r.status_code == 403 and "no permission to see its processes" in r.get_data(as_text=True)
    assert worker.alive and mgr.units[four_g].draining is False and nvml.log == []
    nvml.can_list_processes = True
    r = client.post("/v1/gpus/0/geometry", json=body, headers=AUTH)
    assert r.status_code == 200, r.get_data(as_text=True)
    assert gpu.geometry() == ["7g.40gb"] and not worker.alive
    mgr.close()


def test_a_destroy_in_use_answers_409_with_retry_after_and_the_units_serve_on(node):
    mgr, nvml, a100, _, client, digest, gate = node
    gate.set()
    next(g for g in a100.gis.values() if g.start == 4).held = True
    r = client.post("/v1/gpus/0/geometry", json={"profiles": ["7g.40gb"]}, headers=AUTH)
    assert r.status_code == 409 and int(r.headers["Retry-After"]) > 0
    assert a100.layout() == [("4g.20gb", 0, 1), ("3g.20gb", 4, 1)]
    assert sorted(u for u in mgr.units if u.startswith("MIG-")) == sorted(_mig_units(nvml))  # a 4g and a 3g
    assert mgr.run(digest, _unit(mgr, "3g.20gb"), b"k").payload == b"k"


def _scrape(client) -> dict[tuple[str, frozenset], float]:
    """The manager's /metrics as {(sample name, labels): value}, parsed as Prometheus parses it."""
    from prometheus_client.parser import text_string_to_metric_families

    r = client.get("/metrics", headers=AUTH)
    assert r.status_code == 200 and r.mimetype == "text/plain"
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.get_data(as_text=True))
        for s in family.samples
    }


def test_metrics_read_nvml_on_gpus_the_units_own_figures_on_mig_and_count_reconfigurations(node):
    mgr, _, a100, h100, client, digest, gate = node
    gate.set()
    assert client.get("/metrics").status_code == 401  # the cluster token, as /v1/
    h100.used_mb, h100.utilization = 2048, 37
    four_g = _unit(mgr, "4g.20gb")
    got = _scrape(client)
    gpu = lambda name, uuid: got[(name, frozenset({"gpu_uuid": uuid}.items()))]  # noqa: E731
    assert gpu("nv_gpu_memory_total_bytes", h100.uuid) == 81559 * 1024**2  # NVML's figures on a whole GPU
    assert gpu("nv_gpu_memory_used_bytes", h100.uuid) == 2048 * 1024**2
    assert gpu("nv_gpu_utilization", h100.uuid) == pytest.approx(0.37)
    assert gpu("nv_gpu_memory_total_bytes", four_g) == mgr.units[four_g].info.memory_mb * 1024**2
    assert gpu("nv_gpu_utilization", four_g) == 0.0  # NVML has none for a MIG device: the unit's own (idle)
    info = {dict(labels)["unit"]: dict(labels) for (name, labels) in got if name == "faas_gpu_unit_info"}
    assert info[four_g]["kind"] == "mig" and info[four_g]["profile"] == "4g.20gb" and info[four_g]["gpu"] == "0"
    assert info[h100.uuid]["kind"] == "gpu" and info[h100.uuid]["profile"] == ""

    for _ in range(3):
        assert client.post(f"/v1/jobs/{digest}?unit={four_g}", data=BATCH, headers=AUTH).status_code == 200
    got = _scrape(client)
    unit = frozenset({"unit": four_g}.items())
    assert got[("faas_gpu_model_cache_misses_total", unit)] == 1
    assert got[("faas_gpu_model_cache_hits_total", unit)] == 2
    assert got[("faas_gpu_model_loads_total", unit)] == 1
    assert got[("faas_gpu_model_load_seconds_count", unit)] == 1
    assert got[("faas_gpu_models_cached", unit)] == 1
    assert 0.0 <= gpu("nv_gpu_utilization", four_g) <= 1.0

    body = {"profiles": ["4g.20gb", "2g.10gb", "1g.5gb"]}
    assert client.post("/v1/gpus/0/geometry", json=body, headers=AUTH).status_code == 200
    assert client.post("/v1/gpus/0/geometry", json=body, headers=AUTH).status_code == 200  # no change: not counted
    assert client.post("/v1/gpus/0/geometry", json={"profiles": ["4g.20gb"] * 2}, headers=AUTH).status_code == 400
    assert client.post("/v1/gpus/1/geometry", json={"profiles": ["7g.80gb"]}, headers=AUTH).status_code == 409
    assert client.post("/v1/gpus/7/geometry", json={"profiles": []}, headers=AUTH).status_code == 404
    got = _scrape(client)
    reconf = {
        tuple(sorted(dict(labels).items())): v
        for (name, labels), v in got.items()
        if name == "faas_gpu_mig_reconfigurations_total"
    }
    assert reconf == {
        (("gpu", "0"), ("result", "done")): 1,
        (("gpu", "0"), ("result", "refused")): 1,
        (("gpu", "1"), ("result", "refused")): 1,
    }
    assert got[("faas_gpu_models_cached", unit)] == 0  # drained: its worker stopped, its cache emptied


def test_the_privilege_probe_reads_cap_sys_admin_then_the_mig_config_capability(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    status = tmp_path / "proc/self/status"
    status.write_text("Name:\tpython\nCapEff:\t000001ffffffffff\n")  # root's full set
    assert mig.probe_privilege(tmp_path).allowed
    status.write_text("Name:\tpython\nCapEff:\t0000000000000000\n")
    denied = mig.probe_privilege(tmp_path)
    assert not denied.allowed and "no mig-config capability" in denied.reason
    caps = tmp_path / "proc/driver/nvidia/capabilities/mig"
    caps.mkdir(parents=True)
    (caps / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    missing = mig.probe_privilege(tmp_path)
    assert not missing.allowed and "/dev/nvidia-caps/nvidia-cap1 is not readable" in missing.reason
    (tmp_path / "dev/nvidia-caps").mkdir(parents=True)
    (tmp_path / "dev/nvidia-caps/nvidia-cap1").write_text("")
    granted = mig.probe_privilege(tmp_path)
    assert granted.allowed and "mig-config capability" in granted.reason
    assert granted.to_json() == {"mig_control": True, "mig_control_reason": granted.reason}
