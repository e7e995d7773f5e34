"""`--pin-cpus`: the gateway and each local replica are kept on CPUs of the list, the fewest-held
first; a bad list is refused naming the flag; pins come back when replicas go."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from provider.config import ProviderConfig
from provider.runtime.local import _threads
from provider.runtime.pins import CpuPins, parse_cpu_list, pin_tree
from provider.server import parse_args
from tests.stack_process import StackProcess

from .test_process_groups import LISTENER, children, replica_pids, tree

ALLOWED = sorted(os.sched_getaffinity(0))


def thread_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets of the threads of `pid`."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add(frozenset(os.sched_getaffinity(int(tid))))
        except OSError:  # ended since the listing
            continue
    return out


def tree_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets of the threads of `pid` and of every process under it."""
    out, frontier = set(), [pid]
    while frontier:
        p = frontier.pop()
        out |= thread_cpus(p)
        frontier += children(p)
    return out


def replica_cpus(home: Path) -> list[list[int]]:
    """Each replica's CPUs, sorted; each replica's watchdog, threads and handler share one set."""
    by_replica = [tree_cpus(p) for p in replica_pids(home)]
    assert all(len(sets) == 1 for sets in by_replica), by_replica
    return sorted(sorted(next(iter(sets))) for sets in by_replica)


def test_a_cpu_list_reads_as_taskset_writes_it():
    first = ALLOWED[0]
    assert parse_cpu_list(str(first)) == (first,)
    assert parse_cpu_list(f"{first}-{first},{first}") == (first,)
    if len(ALLOWED) > 1:
        assert parse_cpu_list(f"{ALLOWED[1]},{ALLOWED[0]}") == (ALLOWED[1], ALLOWED[0])


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "-1", "0,,1"])
def test_a_bad_cpu_list_is_refused_naming_the_field(text):
    with pytest.raises(ValueError, match="--pin-cpus"):
        parse_cpu_list(text)


def test_a_cpu_this_process_may_not_use_is_refused():
    with pytest.raises(ValueError, match=r"--pin-cpus: CPU 4096 is not one this process may run on"):
        parse_cpu_list("4096")


def test_the_server_refuses_a_bad_list_and_pinning_other_runtimes(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--pin-cpus", "zero"])
    assert "--pin-cpus: expected a CPU list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--pin-cpus", str(ALLOWED[0]), "--runtime", "docker"])
    assert "only the local runtime pins replicas, not docker" in capsys.readouterr().err
    with pytest.raises(ValueError, match="FAAS_GPU_PIN_CPUS"):
        ProviderConfig.from_env({"FAAS_GPU_PIN_CPUS": "x"})
    assert ProviderConfig.from_env({"FAAS_GPU_PIN_CPUS": str(ALLOWED[0])}).pin_cpus == (ALLOWED[0],)


def test_pins_go_to_the_fewest_held_cpus_and_come_back():
    pins = CpuPins((3, 1, 2))
    assert pins.take() == {3}
    assert pins.take() == {1}
    assert pins.take(2) == {2, 3}  # 2 holds none; then 3 before 1 (list order)
    assert pins.held() == {3: 2, 1: 1, 2: 1}
    pins.give({3})
    pins.give({3})
    pins.give({3})  # more than it held: no negative count
    assert pins.take() == {3}
    assert pins.take(10) == {1, 2, 3}


def test_a_replica_takes_as_many_cpus_as_its_instance_has_threads():
    assert _threads({}) == 1
    assert _threads({"FAAS_GPU_CPU_THREADS": "3"}) == 3
    assert _threads({"FAAS_GPU_CPU_THREADS": "0"}) == 1
    assert _threads({"FAAS_GPU_CPU_THREADS": "many"}) == 1


def test_pin_tree_reaches_every_thread_and_child_process():
    code = (
        "import subprocess, sys, threading, time;"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start();"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        "print('up', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        target = frozenset({ALLOWED[-1]})
        pin_tree(proc.pid, target)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) >= 2 and len(children(proc.pid)) == 1
        assert tree_cpus(proc.pid) == {target}
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)
        proc.kill()
        proc.wait()


def test_the_gateway_and_each_replica_are_kept_on_cpus_of_the_list(tmp_path):
    home = tmp_path / "home"
    cpus = ALLOWED[-2:]  # two where the machine has them: the gateway on the first
    s = StackProcess(home, "--pin-cpus", ",".join(map(str, cpus))).start()
    try:
        (gateway,) = children(s.proc.pid)  # gunicorn's one worker
        assert thread_cpus(gateway) == {frozenset({cpus[0]})}
        body = {"service": "holder", "image": "x", "envProcess": LISTENER, "envVars": {"mode": "http"}}
        assert requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10).status_code == 202
        scale = {"serviceName": "holder", "replicas": 2}
        assert s.request("POST", "/system/scale-function/holder", json=scale).status_code == 202
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            len(replica_pids(home)) == 2 and all(len(tree(p)) == 3 for p in replica_pids(home))
        ):
            time.sleep(0.1)
        # the gateway holds cpus[0]: the first replica goes to the other, the second back to it
        assert replica_cpus(home) == sorted([[cpus[0]], [cpus[-1]]])
        assert thread_cpus(gateway) == {frozenset({cpus[0]})}
        # a replica that stops gives its CPU back: scaled down and up, one replica on each again
        for replicas in (1, 2):
            scale["replicas"] = replicas
            assert s.request("POST", "/system/scale-function/holder", json=scale).status_code == 202
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                len(replica_pids(home)) == replicas and all(len(tree(p)) == 3 for p in replica_pids(home))
            ):
                time.sleep(0.1)
        assert replica_cpus(home) == sorted([[cpus[0]], [cpus[-1]]])
    finally:
        s.stop()
