"""The cross-process contract: what the gateway, the function instances, the scheduler and the
GPU Managers say to each other, written down once.

Why a package of its own, on the ground floor: every fact here is read by at least two processes
that must agree on it (a header name, what an SLO means on the wire, a datastore prefix, an
annotation's rule, a variable's default, the tensor format, an error code). When each daemon kept
its own copy, the copies drifted (an SLO parsed three ways, one variable with two defaults, a
message text used as protocol). The daemons are peers: they import this and the core, never each
other, and this imports nothing of theirs (only the standard library; `wire` adds numpy and torch).

- `headers`: every `X-Faas-Gpu-*` header and the OpenFaaS headers we rely on;
- `slo`: the request class and the SLO (a budget in milliseconds on the wire), parsed once;
- `annotations`: every `com.faas-gpu.*` key with its rule (deploy-time validation uses the table);
- `env`: every `FAAS_GPU_*` variable with its one default and parser;
- `replica`: the paths inside a replica (its secrets, its token, HOME, PATH);
- `keys`: datastore keys and prefixes;
- `records`: the MAC every datastore record carries, keyed from the cluster token;
- `wire`: the job API's binary tensor format;
- `errors`: typed errors that cross processes, each with its HTTP status and code;
- `duration`: the one Go-style duration parser;
- `metrics`: every exported metric's name, type, HELP text and label names.

Submodules are imported one by one (`from faas_gpu.contract import slo`): this file imports none,
so reading a header name never loads torch.
"""
