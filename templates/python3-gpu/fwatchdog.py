"""faas-gpu watchdog: of-watchdog's contract (0.11.6) and the classic watchdog's, in Python.

Modes (env `mode`): `http` forks `fprocess` once and proxies every request to `upstream_url`;
`streaming` and `serializing` fork per request (body on stdin, CGI environment); `classic`
is the classic watchdog (combined output, `Forking fprocess.` / `Wrote N Bytes` log lines).

Our additions, each because several replicas share one host here: `metrics_port` (of-watchdog
hard-codes 8081; `0` disables it), `bind_address` (default 0.0.0.0), `max_body_bytes` (413 above
it), and in http mode `/_/ready` answers 503 until the upstream accepts connections, so a
runtime knows the handler has loaded.

Run: `python fwatchdog.py`; `python fwatchdog.py -run-healthcheck` exits 0 iff the lock exists.
Only the standard library, plus prometheus_client when the metrics server is on.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# faas_gpu.contract.duration's grammar, copied: this file runs in images without faas-gpu
# (tests/test_contract.py checks that the two agree)
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
}
MODES = ("http", "streaming", "serializing", "classic")


def parse_duration(value: str, name: str) -> float:
    """An int means seconds; else a Go duration such as 10s, 1m30s, 500ms."""
    text = value.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise SystemExit(f"fwatchdog: {name}={value!r} is not a duration (e.g. 10s, 1m30s, 500ms)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def log(msg: str) -> None:
    sys.stdout.write(time.strftime("%Y/%m/%d %H:%M:%S ") + msg + "\n")
    sys.stdout.flush()


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
        self.max_body_bytes = int(env.get("max_body_bytes", str(20 * 1024 * 1024)))
        self.combine_output = env.get("combine_output", "true").lower() != "false"
        self.lock_path = os.path.join(tempfile.gettempdir(), ".lock")


class Metrics:
    def __init__(self, port: int):
        self.enabled = port > 0
        if not self.enabled:
            return
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        self.registry = CollectorRegistry()
        self.total = Counter(
            "http_requests", "total HTTP requests processed", ["code", "method"], registry=self.registry
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "Seconds spent serving HTTP requests.",
            ["code", "method"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "http_requests_in_flight", "current number of requests being served", registry=self.registry
        )
        start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def observe(self, code: int, method: str, seconds: float) -> None:
        if self.enabled:
            self.total.labels(str(code), method.lower()).inc()
            self.duration.labels(str(code), method.lower()).observe(seconds)


PR_SET_PDEATHSIG = 1
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)  # Linux; looked up before any fork


def _set_death_signal() -> None:
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _die_with_watchdog(watchdog_pid: int):
    """A `preexec_fn`: the child gets SIGKILL when the watchdog dies, even by kill -9, so no
    handler is left reparented to PID 1 holding its port (the thread that forks must outlive
    the child: the main thread for the http child, the request's thread for a per-request one)."""

    def set_death_signal() -> None:
        _set_death_signal()
        if os.getppid() != watchdog_pid:  # it died before the prctl took effect
            os._exit(1)

    return set_death_signal


class Watchdog:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.inflight = 0
        self.inflight_lock = threading.Lock()
        self.drained = threading.Condition(self.inflight_lock)
        self.child: subprocess.Popen | None = None
        self.accepting = True
        self.metrics = Metrics(cfg.metrics_port)
        self.local = threading.local()
        up = urlsplit(cfg.upstream_url) if cfg.upstream_url else None
        self.upstream = (up.hostname or "127.0.0.1", up.port or 80) if up else None

    # -- lock file -----------------------------------------------------------------------
    def write_lock(self) -> None:
        if not self.cfg.suppress_lock:
            with open(self.cfg.lock_path, "w"):
                pass

    def lock_present(self) -> bool:
        return self.cfg.suppress_lock or os.path.exists(self.cfg.lock_path)

    # -- http mode child -----------------------------------------------------------------
    def start_child(self) -> None:
        self.child = subprocess.Popen(
            shlex.split(self.cfg.fprocess),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_watchdog(os.getpid()),  # noqa: PLW1509 — only prctl runs there
        )
        for stream, name in ((self.child.stdout, "stdout"), (self.child.stderr, "stderr")):
            threading.Thread(target=self._pipe, args=(stream, name), daemon=True).start()
        threading.Thread(target=self._wait_child, daemon=True).start()

    def _pipe(self, stream, name: str) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            log(f"{name}: {line}" if self.cfg.prefix_logs else line)

    def _wait_child(self) -> None:
        code = self.child.wait()
        if self.accepting:
            log(f"Forked function has terminated: exit code {code}")
            os._exit(code or 1)

    def upstream_up(self) -> bool:
        try:
            with socket.create_connection(self.upstream, timeout=0.5):
                return True
        except OSError:
            return False

    def upstream_conn(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(*self.upstream, timeout=timeout)
            self.local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def drop_conn(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.close()
            self.local.conn = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fwatchdog"
    sys_version = ""
    wd: Watchdog

    def log_message(self, format, *args):  # noqa: A002 — of-watchdog logs no access lines
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, Nagle + delayed ACK cost 40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.settimeout(self.wd.cfg.read_timeout + self.wd.cfg.write_timeout + 60)

    # -- plumbing ------------------------------------------------------------------------
    def _send(
        self,
        code: int,
        body: bytes,
        headers: list[tuple[str, str]] | None = None,
        content_type: str = "text/plain; charset=utf-8",
    ) -> None:
        # the upstream's own Date and Server win (of-watchdog copies them and Go adds a Date only
        # when none is set); BaseHTTPRequestHandler.send_response would add a second of each
        upstream = {k.lower() for k, _ in headers or ()}
        self.log_request(code)
        self.send_response_only(code)
        if "server" not in upstream:
            self.send_header("Server", self.version_string())
        if "date" not in upstream:
            self.send_header("Date", self.date_time_string())
        has_ct = False
        for k, v in headers or ():
            if k.lower() in HOP_BY_HOP or k.lower() == "content-length":
                continue
            has_ct = has_ct or k.lower() == "content-type"
            self.send_header(k, v)
        if not has_ct:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes | None:
        limit = self.wd.cfg.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks, total = [], 0
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > limit:
                    return None
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length > limit:
            return None
        return self.rfile.read(length) if length else b""

    # -- routing -------------------------------------------------------------------------
    def do_GET(self):  # noqa: N802
        self.route()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = do_GET  # noqa: N815

    def route(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/_/health":
            return self.health()
        if path == "/_/ready":
            return self.ready()
        wd = self.wd
        with wd.inflight_lock:
            if wd.cfg.max_inflight and wd.inflight >= wd.cfg.max_inflight:
                over = True
            else:
                over = False
                wd.inflight += 1
        if over:
            self._body()
            return self._send(429, b"Concurrent request limit exceeded.\n")
        if wd.metrics.enabled:
            wd.metrics.in_flight.inc()
        t0 = time.monotonic()
        code = 500
        try:
            body = self._body()
            if body is None:
                code = 413
                self.close_connection = True
                return self._send(413, f"request body is larger than {wd.cfg.max_body_bytes} bytes\n".encode())
            code = self.proxy(body, t0) if wd.cfg.mode == "http" else self.fork(body, t0)
        finally:
            with wd.inflight_lock:
                wd.inflight -= 1
                wd.drained.notify_all()
            if wd.metrics.enabled:
                wd.metrics.in_flight.dec()
            wd.metrics.observe(code, self.command, time.monotonic() - t0)

    def health(self) -> None:
        if self.command != "GET":
            return self._send(405, b"Method not allowed\n")
        if self.wd.accepting and self.wd.lock_present():
            return self._send(200, b"OK")
        return self._send(503, b"Service Unavailable\n")

    def ready(self) -> None:
        wd = self.wd
        if self.command != "GET":
            return self._send(405, b"Method not allowed\n")
        if not (wd.accepting and wd.lock_present()):
            return self._send(503, b"Service Unavailable\n")
        if wd.cfg.max_inflight and wd.inflight >= wd.cfg.max_inflight:
            return self._send(429, b"Concurrent request limit exceeded.\n")
        if wd.cfg.mode == "http" and not wd.upstream_up():
            return self._send(503, b"upstream not ready\n")
        if wd.cfg.ready_path and wd.cfg.mode == "http":
            try:
                conn = http.client.HTTPConnection(*wd.upstream, timeout=5)
                conn.request("GET", wd.cfg.ready_path)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                return self._send(resp.status, data, resp.getheaders())
            except OSError:
                return self._send(503, b"upstream not ready\n")
        return self._send(200, b"OK")

    # -- http mode -----------------------------------------------------------------------
    def _timeout(self) -> float:
        limit = self.wd.cfg.exec_timeout
        asked = self.headers.get("X-Timeout")
        if asked:
            try:
                shorter = parse_duration(asked, "X-Timeout")
                if 0 < shorter < limit or limit <= 0:
                    limit = shorter
            except SystemExit:
                pass
        return limit

    def proxy(self, body: bytes, t0: float) -> int:
        wd = self.wd
        timeout = self._timeout() or None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers.pop("Content-Length", None)
        headers["Content-Length"] = str(len(body))
        for attempt in (1, 2):
            conn = wd.upstream_conn(timeout)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except TimeoutError:
                wd.drop_conn()
                msg = f"Timeout after {time.monotonic() - t0:.3f}s waiting for the function\n"
                self._send(504, msg.encode(), [("X-Duration-Seconds", f"{time.monotonic() - t0:.6f}")])
                return 504
            except (OSError, http.client.HTTPException) as exc:
                wd.drop_conn()
                # a kept-alive upstream connection may have been closed meanwhile: retry once
                if attempt == 2 or not isinstance(
                    exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError
                ):
                    self._send(
                        500,
                        f"Can't reach service for: {exc}\n".encode(),
                        [("X-OpenFaaS-Internal", "of-watchdog")],
                    )
                    return 500
        if resp.will_close:
            wd.drop_conn()
        out = [(k, v) for k, v in resp.getheaders() if k.lower() != "x-duration-seconds"]
        out.append(("X-Duration-Seconds", f"{time.monotonic() - t0:.6f}"))
        self._send(resp.status, data, out, content_type=wd.cfg.content_type)
        return resp.status

    # -- fork per request (streaming, serializing, classic) ------------------------------
    def _cgi_env(self, body: bytes) -> dict[str, str]:
        env = dict(os.environ)
        for key in set(self.headers.keys()):
            env["Http_" + key.replace("-", "_")] = self.headers.get(key)
        path, _, query = self.path.partition("?")
        env["Http_Method"] = self.command
        env["Http_Path"] = path
        if query:
            env["Http_Query"] = query
        if self.headers.get("Transfer-Encoding"):
            env["Http_Transfer_Encoding"] = self.headers["Transfer-Encoding"]
        if self.wd.cfg.mode == "classic":
            env["Http_ContentLength"] = str(len(body))
            env["Http_Content_Length"] = str(len(body))
            env["Http_Host"] = self.headers.get("Host", "")
        return env

    def fork(self, body: bytes, t0: float) -> int:
        wd = self.wd
        classic = wd.cfg.mode == "classic"
        if classic:
            log("Forking fprocess.")
        timeout = self._timeout() or None
        stderr = subprocess.STDOUT if (classic and wd.cfg.combine_output) else subprocess.PIPE
        try:
            proc = subprocess.Popen(
                shlex.split(wd.cfg.fprocess),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self._cgi_env(body),
                start_new_session=True,
                preexec_fn=_die_with_watchdog(os.getpid()),  # noqa: PLW1509
            )
        except OSError as exc:
            self._send(500, f"Can't start fprocess: {exc}\n".encode())
            return 500
        try:
            out, err = proc.communicate(body, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            code = 408 if classic else 504
            log(f"Function was killed by ExecTimeout: {timeout}s")
            self._send(
                code,
                f"Function timed out after {timeout}s\n".encode(),
                [("X-Duration-Seconds", f"{time.monotonic() - t0:.6f}")],
            )
            return code
        duration = time.monotonic() - t0
        if err:
            for line in err.decode("utf-8", "replace").splitlines():
                log(f"stderr: {line}")
        code = 200 if proc.returncode == 0 else 500
        if classic:
            log(f"Wrote {len(out)} Bytes - Duration: {duration:.6f}s")
        if code == 500 and not classic:
            out = out or f"exit status {proc.returncode}\n".encode()
        self._send(code, out, [("X-Duration-Seconds", f"{duration:.6f}")], content_type=wd.cfg.content_type)
        return code


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # socketserver's 5 refuses bursts; Go's listener (of-watchdog) takes SOMAXCONN

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up mid-request is no error worth a traceback in the function's log."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


def die_with_launcher() -> None:
    """Under faas-gpu's runtime (FAAS_GPU_PARENT_PID): this replica dies with the provider that
    started it, even by kill -9, and its handler with it (a restarted provider starts anew)."""
    parent = os.environ.get("FAAS_GPU_PARENT_PID", "")
    if parent.isdigit():
        _set_death_signal()
        if os.getppid() != int(parent):
            os._exit(1)


def serve(cfg: Config) -> None:
    die_with_launcher()
    wd = Watchdog(cfg)
    Handler.wd = wd
    server = Server((cfg.bind_address, cfg.port), Handler)
    if cfg.mode == "http":
        wd.start_child()
    wd.write_lock()
    log(f"Watchdog mode: {cfg.mode}\tfprocess: {cfg.fprocess!r}")
    log(f"Listening on port: {cfg.port}")
    stopping = threading.Event()

    def on_term(signum, _frame):
        if stopping.is_set():
            return
        stopping.set()
        threading.Thread(target=shutdown, daemon=True).start()

    def shutdown() -> None:
        log(f"SIGTERM: no new connections in {cfg.healthcheck_interval:.1f}s")
        try:
            os.remove(cfg.lock_path)
        except OSError:
            pass
        time.sleep(cfg.healthcheck_interval)
        wd.accepting = False
        deadline = time.monotonic() + cfg.write_timeout
        with wd.drained:
            while wd.inflight > 0 and time.monotonic() < deadline:
                wd.drained.wait(deadline - time.monotonic())
        log(f"Exiting. Active connections: {wd.inflight}")
        server.shutdown()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    if wd.child and wd.child.poll() is None:
        wd.child.terminate()
        try:
            wd.child.wait(5)
        except subprocess.TimeoutExpired:
            wd.child.kill()


def main(argv: list[str]) -> int:
    if "-run-healthcheck" in argv[1:]:
        return 0 if os.path.exists(os.path.join(tempfile.gettempdir(), ".lock")) else 1
    serve(Config(dict(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
