"""`faas-gpu replay`'s own inputs (issue 45): its flags, the plan it makes of a trace, and what it
reads back from a stack (the status page, each function's answer), hostile or odd ones included.
The live run itself: tests/e2e/test_replay_e2e.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from faas_gpu.cli import CliError
from faas_gpu.cli.replay import Sender, build_parser, cluster_and_caches, main, plan_of
from faas_gpu.ports import free_port


def plan(tmp_path, *argv: str):
    return plan_of(build_parser().parse_args([*argv]))


def test_a_plan_names_the_functions_cycles_the_sizes_and_compresses_the_times(tmp_path):
    trace = tmp_path / "t2021.csv"
    rows = [("A", "x", 10.5, 0.5), ("A", "x", 70.0, 1.0), ("B", "y", 75.0, 1.0), ("C", "z", 130.0, 2.0)]
    trace.write_text("app,func,end_timestamp,duration\n" + "".join(f"{a},{f},{e},{d}\n" for a, f, e, d in rows))
    p = plan(tmp_path, str(trace), "--compress", "10", "--minutes", "3", "--model-mb", "4,8", "--unit-memory-mb", "16")
    assert p.functions == ["replay-0", "replay-1", "replay-2"] and p.size_mb == [4.0, 8.0, 4.0]
    assert p.duration_s == pytest.approx(18.0)
    assert sorted(t for t, _ in p.arrivals) == pytest.approx([1.0, 6.9, 7.4, 12.8])  # recorded starts / 10
    assert dict(zip(p.sources, p.functions, strict=True))["A-x"] == "replay-0"  # the busiest first
    assert not any("inference time" in n for n in p.notes)  # the replay's own models run
    assert any("4 requests of 3 functions compressed x10 into 18 s" in n for n in p.notes)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--compress", "0"], "argument --compress: must be positive, got 0"),
        (["--compress", "2", "--policies", "fifo"], "argument --policies: expected some of lb, lalb, lalb_o3"),
        (["--compress", "2", "--model-mb", "8,-1"], "argument --model-mb: each size must be in (0, 4096] MB"),
        (["--compress", "2", "--scale", "2", "--mean-rate", "1"], "not allowed with argument"),
        (["--compress", "2", "--o3-limit", "-1"], "argument --o3-limit: must be >= 0, got -1"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path, capsys, argv, said):
    trace = tmp_path / "1.txt"
    trace.write_text("1\n2\n")
    with pytest.raises(SystemExit) as exit_:
        main([str(trace), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and "Traceback" not in err


def test_a_trace_or_model_that_cannot_be_replayed_is_refused_before_any_stack_starts(tmp_path, capsys):
    assert main([str(tmp_path / "missing.csv"), "--compress", "2"]) == 2
    assert capsys.readouterr().err.strip() == f"faas-gpu replay: trace: {tmp_path / 'missing.csv'} not found"
    trace = tmp_path / "1.txt"
    trace.write_text("1\n2\n")
    assert main([str(trace), "--compress", "2", "--minutes", "2", "--model-mb", "64", "--unit-memory-mb", "32"]) == 2
    assert "--model-mb: 64 MB does not fit a unit of --unit-memory-mb 32" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("app,func,end_timestamp,duration\nA,x,ten,1\n")
    assert main([str(bad), "--compress", "2"]) == 2
    assert "bad.csv line 2: end_timestamp: expected a number, got 'ten'" in capsys.readouterr().err


def test_the_status_page_gives_the_cluster_the_caches_and_the_policy():
    other, mine = {"functions": ["other.openfaas-fn"]}, {"functions": ["replay-0.openfaas-fn"]}
    status = {
        "units": [
            {"key": "n/cpu-1", "memoryMb": 64, "models": [{"functions": ["replay-1.openfaas-fn"]}]},
            {"key": "n/cpu-0", "memoryMb": 64, "models": [other, mine]},
        ],
        "scheduler": {"policy": "lalb_o3", "o3Limit": 7},
    }
    cluster, warm, policy, limit = cluster_and_caches(status, ["replay-0", "replay-1"])
    assert (cluster.units_per_node, cluster.unit_memory_mb) == (2, 64.0)
    assert warm == {0: ["replay-0"], 1: ["replay-1"]}  # by key, as the scheduler orders its units
    assert (policy, limit) == ("lalb_o3", 7)


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ({"units": []}, "the stack reports no GPU unit"),
        ({"units": [{"key": "a", "memoryMb": 64}, {"key": "b", "memoryMb": 32}]}, "differ in memory"),
        ({"units": [{"key": "a", "memoryMb": "lots"}]}, "not what faas-gpu serves (ValueError"),
        ({"units": [{"key": "a", "memoryMb": -5}]}, "report -5.0 MB of memory"),
        ({"units": [{"key": "a", "memoryMb": 64, "models": 3}]}, "not what faas-gpu serves (TypeError"),
        ({"units": [{"key": "a", "memoryMb": 64}], "scheduler": {"o3Limit": "x"}}, "not what faas-gpu serves"),
    ],
)
def test_a_status_page_that_is_not_faas_gpus_is_a_clear_error(status, said):
    with pytest.raises(CliError) as err:
        cluster_and_caches(status, ["replay-0"])
    assert said in str(err.value)


class _Odd(BaseHTTPRequestHandler):
    """Answers like a function of the same name that is not the replay's."""

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = {"/function/list": b"[1, 2]", "/function/text": b"hello", "/function/fail": b"no"}[self.path]
        self.send_response(500 if self.path.endswith("fail") else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Faas-Gpu-Cache", "hit")
        self.end_headers()
        self.wfile.write(body)


def test_an_answer_without_the_replays_timings_is_still_counted():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Odd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sender = Sender(f"http://127.0.0.1:{server.server_port}", timeout_s=10)
        listed = sender.call("list", 0.0, 0.0)
        assert listed.answered and listed.cache == "hit" and listed.exec_s is None  # the header, no timings
        assert sender.call("text", 0.0, 0.0).answered
        failed = sender.call("fail", 0.0, 0.0)
        assert not failed.answered and failed.status == 500
    finally:
        server.shutdown()
    down = Sender(f"http://127.0.0.1:{free_port()}", timeout_s=2).call("x", 0.0, 0.0)
    assert not down.answered and down.status == "ConnectionError"
    assert json.dumps(down.status)  # an error's status is written to outcomes.csv as it is


def test_what_the_keep_alive_policies_need_is_said_before_any_stack_starts(tmp_path, capsys):
    trace = tmp_path / "1.txt"
    trace.write_text("1\n2\n")
    assert main([str(trace), "--minutes", "2"]) == 2  # placement policies by default: they need --compress
    assert "--compress: required for the placement policies" in capsys.readouterr().err
    assert main([str(trace), "--policies", "lsth", "--gateway", "http://127.0.0.1:9"]) == 2
    assert "lsth and hhp run on a stack of their own" in capsys.readouterr().err
    assert main([str(trace), "--policies", "hhp", "--keepalive-compress", "5000"]) == 2
    assert "--keepalive-compress: at most 3600, got 5000" in capsys.readouterr().err
    assert main([str(trace), "--policies", "hhp", "--keepalive-minutes", "9"]) == 2
    assert "--keepalive-minutes: the trace has 2 minutes, asked for 0..9" in capsys.readouterr().err


def test_a_stack_step_that_outlives_its_time_is_a_clear_error_and_the_stop_still_runs(tmp_path, monkeypatch, capsys):
    """`faas-gpu up` that does not finish (a loaded machine, a function that never gets ready) is the
    part's failure, said with what `up` printed; `down` is still tried, and its own time-out is said."""
    import subprocess

    from faas_gpu.cli import replay as replay_cli

    ran: list[list[str]] = []

    def outlives(cmd, **kwargs):  # what subprocess.run does when the child outlives `timeout`
        ran.append(cmd)
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"], stderr=b"ka-lsth-3 did not become ready")

    monkeypatch.setattr(replay_cli.subprocess, "run", outlives)
    args = build_parser().parse_args([str(tmp_path / "t.txt"), "--compress", "2"])
    stack = replay_cli.LiveStack(tmp_path, tmp_path / "stack.yml", args, "lalb")
    with pytest.raises(CliError) as err:
        stack.start()
    assert "faas-gpu up did not finish within 600s: ka-lsth-3 did not become ready" in str(err.value)
    assert str(tmp_path / "home-lalb") in str(err.value)  # where its logs are
    stack.stop()  # no raise: a stop is best effort, and said
    assert ran[-1][-1] == "down"
    assert "stopping the stack: faas-gpu down did not finish within 180s" in capsys.readouterr().err


class _Replica(BaseHTTPRequestHandler):
    """A replica of the keep-alive run as each start of it answers: pid 1 (its own PID namespace),
    started after the request was sent (a cold start)."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        import time

        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"pid": 1, "started": time.time() + 1.0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_each_cold_start_of_a_replica_in_its_own_pid_namespace_is_counted():
    """Issue 45: a replica in a PID namespace of its own is pid 1 in every start, and the live side
    counted a function's cold starts by pid: every cold start of a function was one (LSTH live 3
    against the replay's 11, with 8 answers each saying it waited for a replica started for it)."""
    import time

    from faas_gpu.sim.replay import live_keepalive

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sender = Sender(f"http://127.0.0.1:{server.server_port}", timeout_s=10)
        outcomes = [sender.call("replay-0", time.perf_counter(), float(s)) for s in range(3)]
    finally:
        server.shutdown()
    assert all(o.cold for o in outcomes)
    assert live_keepalive(outcomes, [], {"replay-0": [1, 1, 1]}, 20.0, 3).cold_starts == 3
