"""The Swarm runtime against a fake Engine API (the docker SDK's APIClient surface it calls): the
service it asks for (containers.py's shared spec as a Swarm task template), readiness from tasks
and nodes, rejected tasks as the function's problem, service logs into the log store, usage,
rolling replacement and removal. No engine needed; tests/e2e/test_swarm_cluster.py runs the
real one."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from provider.logs import LogStore
from provider.runtime import swarm as swarm_mod
from provider.runtime.base import InstanceSpec, LaunchError
from provider.runtime.swarm import SwarmRuntime
from provider.store import SecretStore
from provider.types import FunctionDeployment, FunctionRecord

NODES = {"n1": "10.0.0.1", "n2": "10.0.0.2"}


class FakeAPI:
    """Services, tasks, nodes and secrets as the Engine API returns them (the fields read)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.services_: dict[str, dict] = {}
        self.tasks_: list[dict] = []
        self.nodes_ = {n: {"ID": n, "Status": {"State": "ready", "Addr": a}, "Description": {"Hostname": n}}
                       for n, a in NODES.items()}  # fmt: skip
        self.secrets_: dict[str, dict] = {}
        self.logs: dict[str, list[bytes]] = {}
        self.stats_: dict[str, int] = {}
        self.ids = itertools.count(1)
        self.auto_run: str | None = "n1"  # new services' tasks start running on this node

    # services
    def services(self, filters: dict | None = None) -> list[dict]:
        want = dict(lab.split("=", 1) for lab in (filters or {}).get("label", []))
        with self.lock:
            return [s for s in self.services_.values() if all(s["Spec"]["Labels"].get(k) == v for k, v in want.items())]

    def create_service(self, template: Any, name: str, labels: dict, mode: Any, endpoint_spec: Any) -> dict:
        sid = f"s{next(self.ids)}"
        with self.lock:
            self.services_[sid] = {"ID": sid, "Spec": {"Name": name, "Labels": labels, "TaskTemplate": template}}
            if self.auto_run:
                self._task(sid, self.auto_run, "running")
        return {"ID": sid}

    def remove_service(self, sid: str) -> None:
        with self.lock:
            self.services_.pop(sid, None)
            self.tasks_ = [t for t in self.tasks_ if t["ServiceID"] != sid]

    def service_logs(self, service: str, **kwargs: Any):
        if "since" not in kwargs:  # a stream followed again asks for what is new: nothing here
            yield from self.logs.get(service, [])

    # tasks, nodes
    def _task(self, sid: str, node: str, state: str, err: str = "") -> dict:
        n = next(self.ids)
        task = {"ID": f"t{n}", "ServiceID": sid, "NodeID": node, "DesiredState": "running",
                "Status": {"State": state, "Err": err, "Timestamp": f"2026-01-01T00:00:{n:02d}Z",
                           "ContainerStatus": {"ContainerID": f"c{n}"}}}  # fmt: skip
        self.tasks_.append(task)
        return task

    def tasks(self, filters: dict | None = None) -> list[dict]:
        f = filters or {}
        with self.lock:
            out = list(self.tasks_)
        if "service" in f:
            out = [t for t in out if t["ServiceID"] == f["service"]]
        if "node" in f:
            out = [t for t in out if t["NodeID"] == f["node"]]
        return out

    def nodes(self) -> list[dict]:
        return list(self.nodes_.values())

    def info(self) -> dict:
        return {"Swarm": {"NodeID": "n1"}}

    def stats(self, cid: str, stream: bool, one_shot: bool) -> dict:
        return {"memory_stats": {"usage": self.stats_.get(cid, 0) + 100, "stats": {"inactive_file": 100}}}

    # secrets
    def secrets(self, filters: dict) -> list[dict]:
        return [s for s in self.secrets_.values() if s["Spec"]["Name"] == filters["name"]]

    def create_secret(self, name: str, data: bytes, labels: dict) -> dict:
        sid = f"x{next(self.ids)}"
        self.secrets_[sid] = {"ID": sid, "Spec": {"Name": name, "Labels": labels}, "data": data}
        return {"ID": sid}


class FakeClient:
    def __init__(self) -> None:
        self.api = FakeAPI()


class Tokens:
    def token(self, namespace: str, name: str) -> str:
        return f"token-of-{name}"


def record(**fields: Any) -> FunctionRecord:
    replicas = fields.pop("replicas", 1)
    body = {"service": "classify", "image": "10.77.0.1:5000/classify:latest", **fields}
    return FunctionRecord(FunctionDeployment.from_json(body), "openfaas-fn", replicas)


def wait_for(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


@pytest.fixture
def rt(tmp_path, monkeypatch):
    monkeypatch.setattr(swarm_mod, "probe", lambda url, timeout_s=0.5: True)
    client = FakeClient()
    secrets = SecretStore(tmp_path / "secrets")
    logs = LogStore(tmp_path / "logs")
    runtime = SwarmRuntime(
        client, secrets, logs, {"FAAS_GPU_SCHEDULER_URL": "http://10.0.0.9:8091"}, None, Tokens(),
        stack="test", supervise_every_s=0.02,
    )  # fmt: skip
    runtime.fake = client.api  # type: ignore[attr-defined]
    yield runtime
    runtime.close()


def only_service(rt) -> dict:
    [svc] = wait_for(lambda: rt.fake.services(), 5)
    return svc


def test_a_function_is_a_service_with_the_shared_container_spec(rt):
    rt.secrets.write("openfaas-fn", "api-key", b"s3cret")
    rt.apply(record(
        envProcess="python index.py", envVars={"write_timeout": "10s"}, secrets=["api-key"],
        labels={"com.openfaas.scale.min": "2"}, annotations={"com.faas-gpu.slo-ms": "250"},
        limits={"memory": "256Mi", "cpu": "500m"}, requests={"memory": "128Mi", "cpu": "250m"},
        constraints=["node.labels.gpu==true"],
    ))  # fmt: skip
    svc = only_service(rt)
    labels = svc["Spec"]["Labels"]
    assert labels["com.openfaas.function"] == "classify" and labels["function"] == "true"
    assert labels["com.openfaas.annotations.com.faas-gpu.slo-ms"] == "250"
    assert labels["com.faas-gpu.owner"] == "test" and labels["com.faas-gpu.instance"] == "r0"
    task = svc["Spec"]["TaskTemplate"]
    cs = task["ContainerSpec"]
    env = dict(e.split("=", 1) for e in cs["Env"])
    port = int(labels["com.faas-gpu.port"])
    assert env["port"] == str(port) and env["upstream_url"] == f"http://127.0.0.1:{port + 1}"
    assert env["bind_address"] == "0.0.0.0"  # the gateway is on another node
    assert env["fprocess"] == "python index.py" and env["metrics_port"] == "0"
    # the function's own token, never the cluster's, and as a file: never in the env a function may print
    assert "FAAS_GPU_TOKEN" not in env and env["FAAS_GPU_TOKEN_FILE"] == "/var/openfaas/faas-gpu/token"
    assert not {"FAAS_GPU_HOME", "FAAS_GPU_ETCD", "FAAS_GPU_REDIS", "HOME", "PATH"} & set(env)
    assert env["FAAS_GPU_SCHEDULER_URL"] == "http://10.0.0.9:8091"
    assert cs["Labels"]["com.openfaas.function"] == "classify"
    assert cs["StopGracePeriod"] == 15 * 10**9  # write_timeout + 5 s to drain
    assert cs["Healthcheck"]["Interval"] == 250_000_000
    secret, token = cs["Secrets"]
    assert secret["File"]["Name"] == "/var/openfaas/secrets/api-key"
    assert rt.fake.secrets_[secret["SecretID"]]["data"] == b"s3cret"
    assert token["File"]["Name"] == "/var/openfaas/faas-gpu/token" and token["File"]["Mode"] == 0o444
    assert rt.fake.secrets_[token["SecretID"]]["data"] == b"token-of-classify"
    res = task["Resources"]
    assert res["Limits"] == {"MemoryBytes": 256 * 2**20, "NanoCPUs": 500_000_000}
    assert res["Reservations"] == {"MemoryBytes": 128 * 2**20, "NanoCPUs": 250_000_000}
    assert task["Placement"]["Constraints"] == ["node.labels.gpu==true"]
    assert task["Networks"] == [{"Target": "host"}]


def test_ready_endpoints_are_running_tasks_on_ready_nodes(rt):
    rt.apply(record())
    assert rt.wait_ready("openfaas-fn", "classify", 5)
    port = only_service(rt)["Spec"]["Labels"]["com.faas-gpu.port"]
    assert rt.endpoints("openfaas-fn", "classify") == [f"http://10.0.0.1:{port}"]
    rt.fake.nodes_["n1"]["Status"]["State"] = "down"  # the node is lost: its replica is not served
    wait_for(lambda: not rt.endpoints("openfaas-fn", "classify"))


def test_a_rejected_task_is_the_functions_problem(rt):
    rt.fake.auto_run = None
    rt.apply(record(image="nope:latest"))
    svc = only_service(rt)
    with rt.fake.lock:
        rt.fake._task(svc["ID"], "n1", "rejected", "No such image: nope:latest")
    problem = wait_for(lambda: rt.problem("openfaas-fn", "classify"))
    assert problem == {"state": "rejected", "message": "No such image: nope:latest"}
    assert not rt.wait_ready("openfaas-fn", "classify", 0.5)


def test_service_logs_reach_the_functions_log(rt):
    rt.fake.logs = _Logs([b"starting\nlistening on ", b"8080\n"])
    rt.apply(record())
    only_service(rt)
    lines = wait_for(lambda: [m["text"] for m in rt.logs.read("openfaas-fn", "classify")] or None)
    assert lines == ["starting", "listening on 8080"]
    assert {m["instance"] for m in rt.logs.read("openfaas-fn", "classify")} == {"r0"}


class _Logs(dict):
    """Every service's logs are these chunks."""

    def __init__(self, chunks: list[bytes]):
        super().__init__()
        self.chunks = chunks

    def get(self, key, default=None):
        return self.chunks


def test_usage_counts_the_tasks_on_the_managers_node(rt):
    rt.apply(record(replicas=2))
    rt.set_plan("openfaas-fn", "classify", [InstanceSpec("a"), InstanceSpec("b", {"FAAS_GPU_MAX_BATCH": "8"})])
    wait_for(lambda: len(rt.fake.services()) == 2)
    for t in rt.fake.tasks_:
        rt.fake.stats_[t["Status"]["ContainerStatus"]["ContainerID"]] = 1000
    assert rt.usage("openfaas-fn", "classify") == {"cpu": 0.0, "totalMemoryBytes": 2000.0}
    assert rt.usage("openfaas-fn", "other") is None
    envs = [
        dict(e.split("=", 1) for e in s["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]) for s in rt.fake.services()
    ]
    assert sorted(e.get("FAAS_GPU_MAX_BATCH", "-") for e in envs) == ["-", "8"]  # each instance its own env


class FakeEngine:
    """A node's own engine (`com.faas-gpu.engine`): the stats of the containers it runs."""

    def __init__(self, api: FakeAPI, answers: bool = True):
        self.api = self
        self.fake, self.answers, self.asked = api, answers, 0

    def stats(self, cid: str, stream: bool, one_shot: bool) -> dict:
        self.asked += 1
        if not self.answers:
            raise ConnectionError("connection refused")
        return self.fake.stats(cid, stream, one_shot)


def test_usage_reads_each_tasks_node_engine_and_names_the_replicas_it_cannot_read(rt, monkeypatch):
    fake = rt.fake
    fake.nodes_["n2"]["Spec"] = {"Labels": {"com.faas-gpu.engine": "tcp://10.0.0.2:2376"}}
    for n, state in (("n3", "ready"), ("n4", "down")):
        fake.nodes_[n] = {"ID": n, "Status": {"State": state, "Addr": f"10.0.0.{n[1]}"}, "Description": {"Hostname": n}}
    fake.nodes_["n4"]["Spec"] = {"Labels": {"com.faas-gpu.engine": "tcp://10.0.0.4:2376"}}  # n3 has no label
    engines = {"tcp://10.0.0.2:2376": FakeEngine(fake)}
    monkeypatch.setattr(rt, "_engines", lambda address: engines[address])
    rt.apply(record(replicas=4))
    wait_for(lambda: len(fake.services()) == 4)
    on = {"r0": "n1", "r1": "n2", "r2": "n3", "r3": "n4"}  # n1 is the manager's own node
    for svc in fake.services():
        for t in fake.tasks(filters={"service": svc["ID"]}):
            t["NodeID"] = on[svc["Spec"]["Labels"]["com.faas-gpu.instance"]]
            fake.stats_[t["Status"]["ContainerStatus"]["ContainerID"]] = 1000
    usage = rt.usage("openfaas-fn", "classify")
    assert usage["cpu"] == 0.0 and usage["totalMemoryBytes"] == 2000.0  # r0 here, r1 through n2's engine
    assert engines["tcp://10.0.0.2:2376"].asked == 1
    gaps = {u["instance"]: (u["node"], u["reason"]) for u in usage["faasGpuUnmeasured"]}
    assert set(gaps) == {"r2", "r3"}
    assert gaps["r2"][0] == "n3" and "no com.faas-gpu.engine label" in gaps["r2"][1]
    assert gaps["r3"] == ("n4", "node n4 is down")
    engines["tcp://10.0.0.2:2376"] = FakeEngine(fake, answers=False)  # n2's engine goes
    rt._engine_clients.clear()
    usage = rt.usage("openfaas-fn", "classify")
    assert usage["totalMemoryBytes"] == 1000.0
    r1 = next(u for u in usage["faasGpuUnmeasured"] if u["instance"] == "r1")
    assert r1["node"] == "n2" and r1["reason"].startswith("its engine at tcp://10.0.0.2:2376 did not answer")


def test_a_new_spec_rolls_and_remove_removes(rt):
    rt.apply(record())
    first = only_service(rt)
    wait_for(lambda: rt.endpoints("openfaas-fn", "classify"))
    rt.apply(record(envVars={"A": "2"}))
    wait_for(lambda: [s for s in rt.fake.services() if s["ID"] != first["ID"]] and first["ID"] not in rt.fake.services_)
    rt.remove("openfaas-fn", "classify")
    assert rt.fake.services() == []


def test_a_new_spec_whose_handler_cannot_load_stalls_while_the_old_service_serves(rt, monkeypatch):
    """The new service's watchdog answers /_/ready 500 (its handler raised at import): Swarm keeps
    its task running, the old service serves on, and the rollout says it stalled and why."""
    from provider.runtime.base import Readiness

    rt.apply(record())
    first = only_service(rt)
    old_url = wait_for(lambda: rt.endpoints("openfaas-fn", "classify"))[0]
    broken = Readiness(False, "the handler failed to load: RuntimeError: broken setting")
    monkeypatch.setattr(swarm_mod, "probe", lambda url, timeout_s=0.5: Readiness(True) if url == old_url else broken)
    rt.apply(record(envVars={"BROKEN": "1"}))
    rollout = wait_for(
        lambda: (
            (rt.rollout("openfaas-fn", "classify") or {}).get("state") == "Stalled"
            and rt.rollout("openfaas-fn", "classify")
        )
    )
    assert "broken setting" in rollout["message"] and rollout["oldReplicas"] == 1
    assert rt.endpoints("openfaas-fn", "classify") == [old_url] and rt.problem("openfaas-fn", "classify") is None
    assert first["ID"] in rt.fake.services_
    rt.apply(record())  # the previous spec again: its service is the current one, the new one goes
    wait_for(lambda: rt.rollout("openfaas-fn", "classify") is None and len(rt.fake.services()) == 1)
    assert rt.fake.services()[0]["ID"] == first["ID"]


def test_check_refuses_what_swarm_cannot_run(rt):
    with pytest.raises(LaunchError, match="constraints"):
        rt.check(record(constraints=["gpu"]))
    with pytest.raises(LaunchError, match="not found"):
        rt.check(record(secrets=["missing"]))
    with pytest.raises(LaunchError, match="clashes"):
        rt.check(record(labels={"com.openfaas.annotations.x": "1"}, annotations={"x": "2"}))


def test_on_an_overlay_a_replica_is_reached_at_its_tasks_address_there(tmp_path, monkeypatch):
    monkeypatch.setattr(swarm_mod, "probe", lambda url, timeout_s=0.5: True)
    client = FakeClient()
    rt = SwarmRuntime(client, SecretStore(tmp_path / "s"), LogStore(tmp_path / "l"), network="faas-gpu",
                      supervise_every_s=0.02)  # fmt: skip
    try:
        rt.apply(record())
        [svc] = wait_for(lambda: client.api.services())
        assert svc["Spec"]["TaskTemplate"]["Networks"] == [{"Target": "faas-gpu"}]
        with client.api.lock:
            client.api.tasks_[0]["NetworksAttachments"] = [
                {"Network": {"Spec": {"Name": "ingress"}}, "Addresses": ["10.0.0.5/24"]},
                {"Network": {"Spec": {"Name": "faas-gpu"}}, "Addresses": ["10.0.1.7/24"]},
            ]
        port = svc["Spec"]["Labels"]["com.faas-gpu.port"]
        assert wait_for(lambda: rt.endpoints("openfaas-fn", "classify")) == [f"http://10.0.1.7:{port}"]
    finally:
        rt.close()
