"""FunctionUsage's `cpu`: millicores since the last reading, per replica, from real processes'
CPU time and from the Engine API's container stats."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from provider.runtime.cpu_usage import CpuRate, container_cpu_seconds
from provider.runtime.processes import Replica, cpu_seconds


def test_a_replicas_first_reading_is_its_average_since_it_started_then_the_increase_since_the_last():
    rate = CpuRate()
    assert rate.millicores({"r0": (10.0, 2.0, 6.0)}) == 500.0  # 2 s of CPU in 4 s
    assert rate.millicores({"r0": (12.0, 2.5, 6.0)}) == 250.0  # 0.5 s more in 2 s
    assert rate.millicores({"r0": (14.0, 2.5, 6.0)}) == 0.0  # idle since


def test_replicas_add_up_and_a_replica_replaced_starts_its_own_count():
    rate = CpuRate()
    assert rate.millicores({"r0": (10.0, 1.0, 0.0), "r1": (10.0, 3.0, 0.0)}) == 400.0
    # r1 replaced by r2 (started at 11): neither a negative step nor r1's history
    assert rate.millicores({"r0": (12.0, 1.2, 0.0), "r2": (12.0, 0.5, 11.0)}) == 100.0 + 500.0
    assert set(rate._last) == {"r0", "r2"}  # r1 forgotten


def test_a_counter_that_went_back_is_read_as_a_restart():
    rate = CpuRate()
    rate.millicores({"r0": (10.0, 5.0, 0.0)})
    assert rate.millicores({"r0": (12.0, 1.0, 11.0)}) == 1000.0  # a new process under the same id since 11


def test_a_process_replicas_cpu_is_read_from_proc_children_included():
    burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\ntime.sleep(30)"
    spawn = f"import subprocess,sys; subprocess.run([sys.executable,'-c',{burn!r}])"
    parent = subprocess.Popen([sys.executable, "-c", spawn], start_new_session=True)
    try:
        replica = Replica("r0", 0, parent, run_dir=None, digest="")  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while cpu_seconds(replica) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_seconds(replica) >= 0.3  # the child's busy loop counts for the replica
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_a_containers_cpu_is_the_engines_total_usage():
    assert container_cpu_seconds({"cpu_stats": {"cpu_usage": {"total_usage": 2_500_000_000}}}) == 2.5
    assert container_cpu_seconds({}) == 0.0  # an engine that reports none
