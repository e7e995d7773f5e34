"""`python -m procurer`: PROTEAN's cost-aware procurement (§4.5) as a daemon.

Every second the daemon drives the pure `Procurement` policy with a `CloudProvider` and applies
its decisions: nodes are bought as spot VMs, a failed spot request is followed by an on-demand
one, and a spot VM's eviction notice cordons the node (`/faas-gpu/cordon/<node>` in the
datastore, so the scheduler places nothing new there), a replacement is bought at once (spot
first), and the cordoned node is released once it is idle. `CostMeter` charges every node from
its acquisition to its release or eviction with cocktail's spot prices and an on-demand price of
the spot mean / 0.30 (PROTEAN's `assumptions.yaml`, `simulator.on_demand_price`).

The cloud is `EmulatedCloud` (seeded, revocation probability `--p-rev`): it stands in for an IaaS
API, as the paper's own evaluation emulates revocations and prices. How its nodes map to the
stack: a node's id (`spot-1`, `on-demand-2`, ...) is a GPU Manager's `--node` name. A node is
ready when the cloud says it has booted and a GPU Manager with that name reports units
(`--no-managers`: boot alone); it is idle when it has been cordoned for `--drain-grace` seconds
(the scheduler has seen the cordon) and none of its units reports a running job. `--launch CMD`
starts one GPU Manager per node (`{node}` and `{port}` are filled in) and stops it when the node
goes, standing in for the VM; a node that goes also loses its unit reports and its cordon key.

What it did and what it cost: a JSON status file (`<home>/procurement.json`), an optional
read-only `GET /status` on 127.0.0.1 (`--status-port`), and log lines.

A peer of the other daemons (provider, scheduler, gpu_manager): it imports the core (`faas_gpu`:
the policy, the cloud, cordons, the datastore) and none of them. By role:

- `core`: `Procurer`, the loop body that applies the policy's decisions (cloud, cordons, cost)
- `prices`: cocktail's spot prices and the on-demand price they imply
- `launcher`: one local process per node, standing in for its VM
- `status`: the read-only `GET /status` server
- `daemon`: flags, wiring and the loop (`python -m procurer`)
"""

from .core import UNITS_PREFIX, Counts, HeldNode, Procurer
from .launcher import Launcher
from .prices import DEFAULT_SPOT_CSV, load_prices

__all__ = ["DEFAULT_SPOT_CSV", "UNITS_PREFIX", "Counts", "HeldNode", "Launcher", "Procurer", "load_prices"]
