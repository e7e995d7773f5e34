"""Walls around a process that runs code nobody vouched for: one mechanism, two policies.

- `primitives`: the mechanism, one implementation of each piece: Linux's system calls through
  libc (namespaces, mounts, prctl, capabilities), a read-only tree, the seccomp filter, dropping
  privileges, a clean environment, the path helpers.
- `replica`: the walls of a function's replica on the local runtime (a description, `Sandbox`,
  and the two steps that build it: `unshare_namespaces`, then `enter` in the first process of the
  new PID namespace); `launcher` is the small process the provider runs per replica
  (`python -I -S faas_gpu/sandbox/launcher.py`); `uids` gives each function its own uid.
- `worker`: the walls a GPU Manager's model worker enters itself, single-threaded, with no exec.
- `zygote`: the fork server python3-gpu replicas are forked from (torch and the template loaded
  once); each forked replica enters `replica`'s walls after the fork, before its handler loads.

What each sees is said elsewhere: `provider/runtime/isolation.py` (a replica) and
`gpu_manager/isolation.py` (a model worker). Nothing is imported here: the launcher starts with
no site packages, and every module it loads is on its start's path.
"""
