"""The watchdog's shared state (requests in flight, accepting or draining, the lock file) and its
life: start (the http child or the in-process function, the lock file, the server) and the
graceful stop on SIGTERM (the lock removed, new requests refused after `healthcheck_interval`,
those in flight given `write_timeout`)."""

from __future__ import annotations

import os
import signal
import threading
import time

from .config import Config
from .deadlines import Deadlines
from .front import Handler, Server
from .inproc import InProcess
from .logs import Captured, log
from .metrics import Metrics
from .process import HttpChild
from .proxy import Upstream


class Watchdog:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.inflight = 0
        self.inflight_lock = threading.Lock()
        self.drained = threading.Condition(self.inflight_lock)
        self.accepting = True
        self.metrics = Metrics(cfg.metrics_port)
        self.upstream = Upstream(cfg.upstream_url) if cfg.upstream_url else None
        self.child: HttpChild | None = None
        self.function = InProcess(cfg.fprocess) if cfg.mode == "inproc" else None
        self.deadlines = Deadlines()

    def write_lock(self) -> None:
        if not self.cfg.suppress_lock:
            with open(self.cfg.lock_path, "w"):
                pass

    def lock_present(self) -> bool:
        return self.cfg.suppress_lock or os.path.exists(self.cfg.lock_path)

    def start_child(self) -> None:
        self.child = HttpChild(self.cfg.fprocess, self.cfg.prefix_logs, lambda: self.accepting)
        self.child.start()


def serve(cfg: Config) -> None:
    wd = Watchdog(cfg)
    Handler.wd = wd
    server = Server((cfg.bind_address, cfg.port), Handler)
    captured = None
    if cfg.mode == "http":
        wd.start_child()
    elif cfg.mode == "inproc":
        captured = Captured(cfg.prefix_logs)
        # loaded beside the server, so that /_/ready answers 503 (not a stalled connect) meanwhile
        threading.Thread(target=wd.function.load_or_exit, name="load-function", daemon=True).start()
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
    if wd.child:
        wd.child.stop()
    if captured is not None:
        captured.release()
