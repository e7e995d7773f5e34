"""`scheduler.model_states`: each model's cold start as `/v1/status` shows it."""

from __future__ import annotations

import io

from scheduler.model_states import KEEP, ModelStates


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_an_upload_shows_its_bytes_while_it_is_read_then_the_model_its_stages():
    clock = Clock()
    states = ModelStates(clock)
    body = states.receiving(io.BytesIO(b"x" * 10), "classify.openfaas-fn", 10)
    assert body.read(4) == b"xxxx"
    clock.t += 2
    assert states.status() == {
        "uploading": [{"function": "classify.openfaas-fn", "state": "uploading", "bytes": 4, "total": 10, "s": 2.0}],
        "models": [],
    }
    body.read(100)
    clock.t += 1
    states.uploaded(body, "d1", 10)
    assert states.status()["uploading"] == []
    assert states.status()["models"] == [
        {
            "digest": "d1",
            "state": "uploaded",
            "function": "classify.openfaas-fn",
            "size": 10,
            "upload_s": 3.0,
        }
    ]
    states.copying("d1", "n1/cpu-0")
    assert states.status()["models"][0]["state"] == "copying"
    states.loaded("d1", "n1/cpu-0", 1.23456)
    (m,) = states.status()["models"]
    assert (m["state"], m["unit"], m["load_s"], m["function"]) == ("loaded", "n1/cpu-0", 1.235, "classify.openfaas-fn")


def test_a_failed_upload_leaves_nothing_in_flight_and_the_records_stay_bounded():
    states = ModelStates()
    body = states.receiving(io.BytesIO(b"abc"), "f.ns", None)
    body.close()  # the store refused it (the API closes it in any case)
    assert states.status() == {"uploading": [], "models": []}
    for i in range(KEEP + 5):
        states.loaded(f"d{i}", "n/u", 0.1)
    models = states.status()["models"]
    assert len(models) == KEEP and models[-1]["digest"] == f"d{KEEP + 4}" and models[0]["digest"] == "d5"


def test_a_second_upload_of_a_loaded_model_leaves_it_loaded():
    states = ModelStates()
    first = states.receiving(io.BytesIO(b"m"), "a.ns", 1)
    first.read()
    states.uploaded(first, "d", 1)
    states.loaded("d", "n/u", 0.5)
    again = states.receiving(io.BytesIO(b"m"), "b.ns", 1)  # another replica, or another function
    again.read()
    states.uploaded(again, "d", 1)
    (m,) = states.status()["models"]
    assert (m["state"], m["unit"], m["function"]) == ("loaded", "n/u", "b.ns")
