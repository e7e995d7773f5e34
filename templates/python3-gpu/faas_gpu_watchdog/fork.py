"""streaming, serializing and classic modes: one `fprocess` per request, the body on its stdin
and the request in a CGI-style environment (`Http_Method`, `Http_Path`, `Http_<Header>`, ...),
killed with its process group at the request's timeout."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from .logs import log
from .process import die_with_watchdog

if TYPE_CHECKING:
    from .front import Handler


def cgi_env(h: Handler, body: bytes) -> dict[str, str]:
    env = dict(os.environ)
    for key in set(h.headers.keys()):
        env["Http_" + key.replace("-", "_")] = h.headers.get(key)
    path, _, query = h.path.partition("?")
    env["Http_Method"] = h.command
    env["Http_Path"] = path
    if query:
        env["Http_Query"] = query
    if h.headers.get("Transfer-Encoding"):
        env["Http_Transfer_Encoding"] = h.headers["Transfer-Encoding"]
    if h.wd.cfg.mode == "classic":
        env["Http_ContentLength"] = str(len(body))
        env["Http_Content_Length"] = str(len(body))
        env["Http_Host"] = h.headers.get("Host", "")
    return env


def fork(h: Handler, body: bytes, t0: float) -> int:
    """Run `fprocess` for the request `h` is serving and answer with its output; returns the status."""
    wd = h.wd
    classic = wd.cfg.mode == "classic"
    if classic:
        log("Forking fprocess.")
    timeout = h.request_timeout() or None
    stderr = subprocess.STDOUT if (classic and wd.cfg.combine_output) else subprocess.PIPE
    try:
        proc = subprocess.Popen(
            shlex.split(wd.cfg.fprocess),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=cgi_env(h, body),
            start_new_session=True,
            preexec_fn=die_with_watchdog(os.getpid()),  # noqa: PLW1509
        )
    except OSError as exc:
        h.reply(500, f"Can't start fprocess: {exc}\n".encode())
        return 500
    try:
        out, err = proc.communicate(body, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        code = 408 if classic else 504
        log(f"Function was killed by ExecTimeout: {timeout}s")
        h.reply(
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
    h.reply(code, out, [("X-Duration-Seconds", f"{duration:.6f}")], content_type=wd.cfg.content_type)
    return code
