"""The `/system/*` handlers, one verb per module, as faasd's `pkg/provider/handlers/` lays them out.

Each module offers a `make_*` factory that closes over only what its verb uses (a bound method of
the Provider, a store, a flag), never the whole app, so a handler reads on its own and can be
built in a test from fakes. `provider/system.py` only wires them to routes.

- `deploy`, `update`, `delete`, `scale`: the function verbs (POST/PUT/DELETE /system/functions,
  POST /system/scale-function/<name>)
- `read` (list), `replicas` (one function's status), `instances` (faas-gpu's per-instance view)
- `secrets`, `logs`, `info`, `namespaces`, `health`, `query` (the gateway's one Prometheus query)
- `alert` (AlertManager's webhook on the gateway routes: scales plain functions as CE does)
- `auth` (basic auth in front of /system/*), `errors` (exceptions to status lines),
  `http` (the bits every verb shares: plain-text replies, the JSON body, the namespace query)
"""
