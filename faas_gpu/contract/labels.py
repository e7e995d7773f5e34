"""The `com.faas-gpu.*` labels the container runtimes put on what they start (Docker containers,
Swarm services), never read from a deployment.

Why in the contract: a provider that restarts finds its containers and services by these
labels (`provider.runtime.docker`, `provider.runtime.swarm`), and tooling reads them to tell a
replica apart (which provider owns it, which replica and spec it is, on which port it serves).
They share the annotations' prefix, so a deployment that sets one (as a label or an annotation) is
refused by the annotation rules (`annotations.check`: not a key a function may set), and no
function can pass itself off as another provider's replica.
"""

from __future__ import annotations

OWNER = "com.faas-gpu.owner"
"""Which provider (state folder) runs the container: a restarted provider removes only its own."""
REPLICA = "com.faas-gpu.replica"
DIGEST = "com.faas-gpu.digest"
"""The replica's spec (image id, env, limits) as a digest: a changed spec rolls the replica."""
SLOT = "com.faas-gpu.slot"
PORT = "com.faas-gpu.port"
"""The watchdog's port on the host network."""
INSTANCE = "com.faas-gpu.instance"
"""A Swarm service's instance id (r0, r1, ..., or an INFless plan's instance)."""

ENGINE = "com.faas-gpu.engine"
"""A Swarm *node* label the operator sets (`docker node update --label-add
com.faas-gpu.engine=tcp://10.0.0.2:2376 <node>`): where that node's own Engine API is reached. The
Engine API gives a container's stats only on the node that runs it, so the Swarm runtime reads the
usage of tasks on other nodes there (TLS settings as the manager's: DOCKER_TLS_VERIFY,
DOCKER_CERT_PATH). Not a runtime label: nothing the runtimes start carries it."""

RUNTIME_LABELS = frozenset({OWNER, REPLICA, DIGEST, SLOT, PORT, INSTANCE})
NODE_LABELS = frozenset({ENGINE})
"""Labels of Swarm nodes, set by the operator; like the runtime labels, never a deployment's."""
