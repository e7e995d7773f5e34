"""Where a function replica finds what the stack gives it, whatever runs it (a sandboxed process,
a Docker container, a Swarm task): paths inside the replica, read by the function's own code (its
secrets) and by the GPU client (its token).

Why in the contract: the runtimes write these paths and code in the replica reads them; a handler
written for OpenFaaS opens /var/openfaas/secrets/<name> on any of them.
"""

from __future__ import annotations

SECRETS_PATH = "/var/openfaas/secrets"
"""A function's secrets, one read-only file per secret named as the secret: OpenFaaS's path (faasd,
faas-netes; the certifier's SecretCRUD test `cat`s it)."""
FAAS_GPU_DIR = "/var/openfaas/faas-gpu"
"""faas-gpu's own files for the replica, apart from the secrets so that no secret's name shadows them."""
TOKEN_PATH = f"{FAAS_GPU_DIR}/token"
"""The function's own token for the scheduler and the GPU Managers (`env.TOKEN_FILE` names it)."""
HOME = "/home/app"
"""A sandboxed replica's HOME (private, writable) and, without an image, its working folder: the
python3-gpu image's user's home."""
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""A replica's PATH, after its function's environment's `bin`: Docker's default, as an image has it."""
