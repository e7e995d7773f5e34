"""Datastore keys and prefixes: who writes where, and who reads it.

Why here: a key is protocol between daemons that never call each other (a GPU Manager writes its
units, the scheduler and the procurer read them); two spellings of one prefix would be two
datastores as far as they are concerned.
"""

from __future__ import annotations

ROOT = "/faas-gpu/"

UNITS = "/faas-gpu/units/"
"""`<node>/<unit>` -> the unit's status JSON: each GPU Manager writes its own under a lease; the
scheduler, its GPU Reconfigurator and the procurer read them."""
FUNCTIONS = "/faas-gpu/functions/"
"""`<namespace>/<name>` -> a function's record (the provider's store)."""
FN_CREDENTIALS = "/faas-gpu/fn-credentials/"
"""`<sha256 of a function's token>` -> {namespace, name}: the provider writes, the scheduler reads."""
FN_MODELS = "/faas-gpu/fn-models/"
"""`<namespace>/<name>/<digest>`: the models a function uploaded (it may run only those)."""
SCHEDULER = "/faas-gpu/scheduler/"
SCHEDULER_MEMBERS = "/faas-gpu/scheduler/members/"
"""`<identity>` -> a scheduler replica's URL, under its lease (the provider finds schedulers here)."""
SCHEDULER_LEADER = "/faas-gpu/scheduler/leader"
"""The scheduler leader's identity, under its lease."""
CORDON = "/faas-gpu/cordon/"
"""`<node>` -> why and since when a node takes no new work (spot eviction, retirement)."""
INSTANCES = "/faas-gpu/instances/"
"""`<namespace>/<name>` -> the INFless autoscaler's per-instance plans."""


def unit(node: str, unit_id: str) -> str:
    """The key of one unit's status."""
    return f"{UNITS}{node}/{unit_id}"
