"""The parts of faas-gpu's watchdog (`fwatchdog.py` beside this folder is the entry point).

`config` (the environment variables, of-watchdog's names and defaults), `durations` (Go durations
and the per-request timeout), `logs`, `metrics` (Prometheus), `process` (the forked function
process and dying with the watchdog), `proxy` (http mode: the upstream and forwarding),
`fork` (one process per request: streaming, serializing, classic), `front` (the HTTP server and
its routes) and `watchdog` (shared state, start and graceful shutdown).

Only the standard library, plus prometheus_client when the metrics server is on: this runs in
function images that have no faas-gpu installed.
"""
