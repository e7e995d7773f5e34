"""The watchdog's settings from its environment: of-watchdog's variables (0.11.6) with their
defaults, and our additions (`bind_address`, `max_body_bytes`, `metrics_port` 0 to disable, mode
`inproc`); a
bad mode, a missing fprocess or a bad duration stops the watchdog at start, naming the variable."""

from __future__ import annotations

import os
import tempfile

from .durations import MAX_WAIT_S
from .durations import parse_duration as _parse


def parse_duration(value: str, name: str) -> float:
    """A setting's duration, no longer than the longest wait a poll takes (`MAX_WAIT_S`)."""
    return min(_parse(value, name), MAX_WAIT_S)


MODES = ("http", "streaming", "serializing", "classic", "inproc")


class Config:
    def __init__(self, env: dict[str, str]):
        self.fprocess = env.get("fprocess") or env.get("function_process") or ""
        self.mode = env.get("mode", "streaming")
        if self.mode not in MODES:
            raise SystemExit(f"fwatchdog: unknown mode {self.mode!r} (one of {', '.join(MODES)})")
        if not self.fprocess:
            raise SystemExit("fwatchdog: fprocess (or function_process) is required")
        self.upstream_url = env.get("upstream_url") or env.get("http_upstream_url") or ""
        if self.mode == "http" and not self.upstream_url:
            raise SystemExit("fwatchdog: upstream_url is required in http mode")
        self.port = int(env.get("port", "8080"))
        self.bind_address = env.get("bind_address", "0.0.0.0")
        self.read_timeout = parse_duration(env.get("read_timeout", "30s"), "read_timeout")
        self.write_timeout = parse_duration(env.get("write_timeout", "30s"), "write_timeout")
        if self.write_timeout <= 0:
            raise SystemExit("fwatchdog: write_timeout must be greater than 0")
        default_exec = "0" if self.mode == "classic" else "30s"
        self.exec_timeout = parse_duration(env.get("exec_timeout", default_exec), "exec_timeout")
        self.healthcheck_interval = parse_duration(
            env.get("healthcheck_interval", env.get("write_timeout", "30s")), "healthcheck_interval"
        )
        self.max_inflight = int(env.get("max_inflight", "0"))
        self.metrics_port = int(env.get("metrics_port", "8081"))
        self.prefix_logs = env.get("prefix_logs", "true").lower() != "false"
        self.suppress_lock = env.get("suppress_lock", "false").lower() == "true"
        default_ct = "text/plain" if self.mode == "classic" else "application/octet-stream"
        self.content_type = env.get("content_type", default_ct)
        self.ready_path = env.get("ready_path", "")
        callid = env.get("log_callid", "")
        self.log_callid = callid == "1" or callid.lower() == "true" or callid == "t"
        self.max_body_bytes = int(env.get("max_body_bytes", str(20 * 1024 * 1024)))
        self.combine_output = env.get("combine_output", "true").lower() != "false"
        self.lock_path = os.path.join(tempfile.gettempdir(), ".lock")
