"""The scheduler's fit checks charge a model what the GPU Managers measured it to cost on a unit
(issue 19): the answers' `X-Faas-Gpu-Model-Mb` and the units' `measured_mb`; before any
measurement its artifact plus the per-process overhead the managers state (`overhead_mb`)."""

from __future__ import annotations

import json

import pytest

from faas_gpu.contract.keys import unit as unit_key
from faas_gpu.datastore import open_datastore
from faas_gpu.models import ModelStore
from faas_gpu.policies import PlacementError
from scheduler.catalog import ModelCatalog
from scheduler.units import Refresh, UnitView
from tests.fake_worker import stored_program


@pytest.fixture
def ds(tmp_path):
    store = open_datastore(None, tmp_path / "state.db")
    yield store
    store.close()


def _report(ds, unit: str, memory_mb: float, **extra) -> None:
    body = {"node": "n1", "unit": unit, "url": "http://127.0.0.1:9", "memory_mb": memory_mb, **extra}
    ds.put(unit_key("n1", unit), json.dumps(body))


def _view(ds, catalog: ModelCatalog) -> UnitView:
    view = UnitView(ds, clock=lambda: 0.0)
    assert view.apply(view.read(view.next_read(), None), catalog) is Refresh.REBUILT
    return view


def test_placement_charges_the_measured_cost_else_the_artifact_plus_the_stated_overhead(tmp_path, ds):
    store = ModelStore(tmp_path / "models")
    measured, fresh = stored_program(store, "a"), stored_program(store, "b")
    _report(ds, "GPU-1", 81559, overhead_mb=600.0, measured_mb={measured: 1500.0})
    catalog = ModelCatalog(store)
    view = _view(ds, catalog)
    assert catalog.get(measured, view.policy).size_mb == 1500.0
    assert catalog.get(fresh, view.policy).size_mb == pytest.approx(store.get(fresh).size / 2**20 + 600.0)
    # an answer carries the cost after a larger batch: the policy's fit checks learn it
    catalog.observe(fresh, view.policy, False, 0.5, 0.01, model_mb=2100.0)
    assert view.policy.models[fresh].size_mb == 2100.0
    catalog.observe(fresh, view.policy, True, 0.0, 0.01, model_mb=900.0)  # the largest seen stays
    assert view.policy.models[fresh].size_mb == 2100.0


def test_a_model_measured_past_every_unit_keeps_its_size_and_new_ones_must_fit_with_the_overhead(tmp_path, ds):
    store = ModelStore(tmp_path / "models")
    digest = stored_program(store, "a")
    _report(ds, "MIG-1", 4864, overhead_mb=600.0)
    catalog = ModelCatalog(store)
    view = _view(ds, catalog)
    before = catalog.get(digest, view.policy).size_mb
    catalog.observe(digest, view.policy, False, 0.5, 0.01, model_mb=6000.0)  # logged, not raised
    assert view.policy.models[digest].size_mb == before
    _report(ds, "MIG-1", 4864, overhead_mb=4864.0)  # a context as large as the unit: nothing fits
    view.apply(view.read(view.next_read(), None), catalog)
    with pytest.raises(PlacementError):
        catalog.get(stored_program(store, "b"), view.policy)


def test_placements_view_of_a_unit_keeps_to_its_managers_model_cap(tmp_path, ds):
    """A unit reporting `max_models` (its worker cap; under MPS the client limit) is modelled with
    that cap, so placement expects the eviction the manager will make; a changed cap rebuilds."""
    store = ModelStore(tmp_path / "models")
    a, b = stored_program(store, "a"), stored_program(store, "b")
    _report(ds, "GPU-1", 81559, max_models=1)
    catalog = ModelCatalog(store)
    view = _view(ds, catalog)
    cache = view.policy.units[0].cache
    assert cache.max_models == 1
    cache.load(a, catalog.get(a, view.policy).size_mb)
    assert cache.victims_for(catalog.get(b, view.policy).size_mb) == [a]  # 80 GB free, one model at most
    _report(ds, "GPU-1", 81559, max_models=6)
    assert view.apply(view.read(view.next_read(), None), catalog) is Refresh.REBUILT
    assert view.policy.units[0].cache.max_models == 6 and view.policy.units[0].cache.models == [a]  # carried over
