"""The gateway's resend of a call a replica lost: a watchdog's own 500 for a function process that
had gone (a container being killed stops its handler before its watchdog) is sent once more, as
a dropped connection is; the function's own 500 never is.

Seen on a Swarm worker lost under load (benchmarks/cluster.py): 5 of 1,525 calls answered the
watchdog's `Can't reach service for: [Errno 111] Connection refused` while the others were
resent. Here the replicas are stand-ins at the gateway's one seam to them (`invoker.forward`).
"""

from __future__ import annotations

from types import SimpleNamespace

from provider.gateway import InvocationApp, lost_its_function
from provider.invoke import ReplicaDropped, Result

KEY = ("fn", "openfaas-fn")
LOST = Result(
    500, [("X-OpenFaaS-Internal", "of-watchdog")], b"Can't reach service for: [Errno 111] Connection refused\n"
)
OWN_500 = Result(500, [("Content-Type", "text/plain")], b"Can't reach service for: my database\n")
OK = Result(200, [], b"answered")


class Replicas:
    """`forward` answers in turn from `answers`, recording the replica each call was sent to."""

    ready_timeout_s = 1.0

    def __init__(self, *answers: Result, ready: tuple[str, ...] = ("http://replica-a", "http://replica-b")):
        self.answers, self.sent_to = list(answers), []
        self.ready, self.turn = list(ready), 0
        self.runtime = SimpleNamespace(endpoints=lambda name, namespace: self.ready)

    def forward(self, url, method, path, query, headers, body, may_resend=None, stream=False) -> Result:
        self.sent_to.append(url)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def pick(self, key, headers) -> str:
        """Round robin over the ready replicas, starting where the call was first sent."""
        self.turn += 1
        return self.ready[self.turn % len(self.ready)] if self.ready else None


def gateway(replicas: Replicas, annotations: dict[str, str] | None = None) -> InvocationApp:
    app = InvocationApp.__new__(InvocationApp)  # only `_send`'s collaborators, not a whole provider
    record = SimpleNamespace(deployment=SimpleNamespace(annotations=annotations or {}))
    app.invoker = replicas
    app.provider = SimpleNamespace(store=SimpleNamespace(cached=lambda name, namespace: record))
    return app


def send(app: InvocationApp) -> Result:
    return app._send(KEY, "http://replica-a", "POST", "/", "", {}, b"x")


def test_a_watchdog_that_lost_its_function_process_gets_the_call_resent_to_another_replica():
    replicas = Replicas(LOST, OK)
    assert send(gateway(replicas)) == OK
    assert replicas.sent_to == ["http://replica-a", "http://replica-b"]


def test_the_resend_never_goes_back_to_the_replica_that_lost_the_call():
    """The runtime still lists a replica of a node just lost, or of a container being stopped
    (its watchdog accepts, then drops the call again): round robin would send the resend back to
    it every other time. Seen as 2 of 1,395 calls answered 502 on a Swarm node loss under load."""
    reset = ReplicaDropped("http://replica-a: ConnectionResetError(104, 'reset')")
    for first in (reset, LOST):
        replicas = Replicas(first, OK)
        replicas.turn = 1  # the next pick is replica-a, the one that lost the call
        assert send(gateway(replicas)) == OK
        assert replicas.sent_to == ["http://replica-a", "http://replica-b"]


def test_a_lone_replica_gets_the_resend_itself():
    """With no other replica, the resend goes to the same address (the runtime's replacement there)."""
    replicas = Replicas(LOST, OK, ready=("http://replica-a",))
    assert send(gateway(replicas)) == OK
    assert replicas.sent_to == ["http://replica-a", "http://replica-a"]


def test_the_resend_happens_once_only():
    replicas = Replicas(LOST, LOST, OK)
    assert send(gateway(replicas)) == LOST and len(replicas.sent_to) == 2


def test_the_functions_own_500_is_answered_as_it_is():
    replicas = Replicas(OWN_500, OK)
    assert send(gateway(replicas)) == OWN_500 and replicas.sent_to == ["http://replica-a"]
    assert not lost_its_function(OWN_500) and lost_its_function(LOST)


def test_a_function_that_must_not_run_twice_gets_the_watchdogs_500():
    replicas = Replicas(LOST, OK)
    assert send(gateway(replicas, {"com.faas-gpu.retry-on-reset": "false"})) == LOST
    assert replicas.sent_to == ["http://replica-a"]
