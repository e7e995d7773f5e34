"""Cordoned nodes: the datastore keys procurement writes and placement reads.

A node is cordoned when it must take no new work (PROTEAN §4.5: its spot VM got an eviction
notice, or it is being retired): `/faas-gpu/cordon/<node>` holds why and since when. The
scheduler leaves the units of cordoned nodes out of placement; their running jobs finish. The
node name is the GPU Manager's `--node`, the same name its unit reports carry.
"""

from __future__ import annotations

import json
import time

from faas_gpu.contract import keys
from faas_gpu.datastore import Datastore

CORDON_PREFIX = keys.CORDON


def cordon(ds: Datastore, node: str, reason: str, **extra: object) -> None:
    if not node or "/" in node:
        raise ValueError(f"node: must be a non-empty name without '/', got {node!r}")
    ds.put_json(CORDON_PREFIX + node, {"node": node, "reason": reason, "since": time.time(), **extra})


def uncordon(ds: Datastore, node: str) -> None:
    ds.delete(CORDON_PREFIX + node)


def cordoned_nodes(ds: Datastore) -> dict[str, dict]:
    """Every cordoned node, with what its key says (an unreadable value still cordons)."""
    out: dict[str, dict] = {}
    for kv in ds.get_prefix(CORDON_PREFIX):
        try:
            info = json.loads(kv.value)
        except ValueError:
            info = {}
        out[kv.key[len(CORDON_PREFIX) :]] = info if isinstance(info, dict) else {}
    return out
