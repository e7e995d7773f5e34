"""Invocation routes (`/function/*`, `/async-function/*`) as plain WSGI: the hot path.

Flask would add ~100 µs a call; these routes parse the path themselves and forward through a
kept-alive connection (one per thread and replica, `provider.upstream`) to the chosen replica.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from queue import Empty, Queue

from faas_gpu import tracing
from faas_gpu.async_queue import Delivery, QueueStorageFull, QueueUnavailable, call_key
from faas_gpu.contract import headers as h
from faas_gpu.contract.annotations import RETRY_ON_RESET, is_true
from faas_gpu.contract.http_status import status_line
from faas_gpu.contract.slo import RequestClass, RequestSlo, parse_request
from faas_gpu.datastore import DatastoreUnavailable

from .callbacks import Callback, CallbackDispatcher, Outcome, parse_callback_url
from .core import Provider
from .inflight import TooManyInFlight
from .invoke import (
    ColdStartTimeout,
    NotFound,
    ReplicaDropped,
    ReplicaError,
    ReplicaRefused,
    ReplicaTimeout,
    Result,
    Unavailable,
)
from .metrics import GatewayMetrics
from .scaling.harmony import APP_HEADER, APPS, BadApp, parse_apps

log = logging.getLogger(__name__)

ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"})
INTERNAL = ("X-OpenFaaS-Internal", "gateway")
StartResponse = Callable[..., object]


class BodyTooLarge(Exception):
    pass


def read_body(environ: dict, limit: int) -> bytes:
    """The whole request body, chunked or not; BodyTooLarge past `limit`."""
    length = environ.get("CONTENT_LENGTH")
    stream = environ["wsgi.input"]
    if length:
        n = int(length)
        if n > limit:
            raise BodyTooLarge
        return stream.read(n)
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise BodyTooLarge
    return data


def request_headers(environ: dict) -> dict[str, str]:
    headers = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers[key[5:].replace("_", "-").title()] = value
    if environ.get("CONTENT_TYPE"):
        headers["Content-Type"] = environ["CONTENT_TYPE"]
    return headers


def plain(start_response: StartResponse, code: int, message: str, extra=()) -> Iterable[bytes]:
    body = (message + "\n").encode()
    start_response(
        status_line(code),
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), *extra],
    )
    return [body]


class InvocationApp:
    """WSGI app for /function/ and /async-function/; anything else goes to `fallback`."""

    def __init__(self, provider: Provider, metrics: GatewayMetrics, fallback, *, gateway: bool):
        self.provider = provider
        self.invoker = provider.invoker
        self.metrics = metrics
        self.fallback = fallback
        self.gateway = gateway
        self.max_body = provider.config.max_body_bytes
        self.recording = provider.config.metrics  # off: no per-call metrics or activity (`--no-metrics`)
        # The gateway_* counters are the gateway's own (CE's gateway/metrics): calls that come in on
        # the provider's port went through a gateway already (the CE gateway in front, which counts
        # them itself), and faas-provider's proxy route is not instrumented (serve.go). Counted
        # here again, a Prometheus scraping both would see every call twice.
        self.gateway_counts = self.recording and gateway

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/function/"):
            return self.sync(environ, start_response, path[len("/function/") :])
        if self.gateway and path.startswith("/async-function/"):
            return self.enqueue(environ, start_response, path[len("/async-function/") :])
        return self.fallback(environ, start_response)

    # -- synchronous ---------------------------------------------------------------------
    def sync(self, environ: dict, start_response: StartResponse, rest: str) -> Iterable[bytes]:
        raw_name, _, sub = rest.partition("/")
        method = environ["REQUEST_METHOD"]
        if not raw_name:
            return plain(start_response, 404, "function name is required")
        if method not in ALLOWED_METHODS:
            return plain(start_response, 405, f"method {method} is not allowed", [INTERNAL])
        try:
            body = read_body(environ, self.max_body)
        except BodyTooLarge:
            return plain(start_response, 413, f"body: request body is larger than {self.max_body} bytes")
        headers = request_headers(environ)
        call_id = headers.setdefault(h.CALL_ID, str(uuid.uuid4()))
        start_ns = headers.setdefault(h.START_TIME, str(time.time_ns()))
        headers.setdefault("X-Forwarded-Host", environ.get("HTTP_HOST", ""))
        headers.setdefault("X-Forwarded-For", environ.get("REMOTE_ADDR", ""))
        result = self.call(raw_name, method, "/" + sub, environ.get("QUERY_STRING", ""), headers, body, stream=True)
        out = result.headers + [(h.CALL_ID, call_id), (h.START_TIME, start_ns)]
        if not any(k.lower() == "content-type" for k, _ in out):
            out.append(("Content-Type", headers.get("Content-Type", "text/plain")))
        if result.stream is not None:  # sent on as it arrives, chunked (`provider.streaming`)
            result.stream.bind(environ.get("gunicorn.socket"))  # a caller that stops reading is dropped
            start_response(status_line(result.status), out)
            return result.stream
        out.append(("Content-Length", str(len(result.body))))
        start_response(status_line(result.status), out)
        return [result.body] if method != "HEAD" else []

    def call(
        self,
        raw_name: str,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        *,
        wait_for_slot: bool = False,
        stream: bool = False,
    ) -> Result:
        """One invocation through the dispatcher; errors become OpenFaaS's proxy answers.

        Past the function's in-flight limit it answers 429 at once (`provider.inflight`), so a
        slow function never holds the threads others need; `wait_for_slot` (queued work, which
        holds no gateway thread) waits for a slot instead. `stream`: an answer the replica
        streams comes back at its head (`Result.stream`), and the call stays in flight (its slot,
        its metrics) until that stream is closed."""
        try:
            key = self.invoker.resolve(raw_name)
        except ValueError:
            return _error(404, f"No endpoints available for: {raw_name}.")
        try:  # PROTEAN's request class and SLO: parsed here (400), forwarded as parsed
            slo = parse_request(headers)
            headers = slo.forwarded(headers)
        except ValueError as exc:
            return _error(400, str(exc))
        label = f"{key[1]}.{key[0]}"
        if self.gateway_counts:
            self.metrics.started(label)
        t0 = time.perf_counter()
        try:
            self.invoker.inflight.enter(key, self.invoker.inflight_limit(key), wait=wait_for_slot)
        except TooManyInFlight as exc:
            result = _error(429, str(exc))
            self._finished(key, label, result.status, time.perf_counter() - t0, slo)
            return result
        streamed = None
        try:
            if tracing.enabled():
                result = self._traced_forward(key, raw_name, method, path, query, headers, body, wait_for_slot, stream)
            else:
                result = self._forward(key, raw_name, method, path, query, headers, body, wait_for_slot, stream)
            streamed = result.stream
        finally:
            if streamed is None:
                self.invoker.inflight.leave(key)
        if streamed is not None:  # in flight until the stream ends; its duration counted then
            status = result.status
            streamed.label = label

            def finish(whole: bool) -> None:
                self.invoker.inflight.leave(key)
                self._finished(key, label, status, time.perf_counter() - t0, slo)

            streamed.at_end(finish)
            return result
        self._finished(key, label, result.status, time.perf_counter() - t0, slo)
        return result

    def _traced_forward(
        self,
        key: tuple[str, str],
        raw_name: str,
        method: str,
        path: str,
        query: str,
        headers: dict,
        body: bytes,
        wait_for_slot: bool = False,
        stream: bool = False,
    ) -> Result:
        """`_forward` inside the gateway's spans, the replica given our `traceparent` (the caller's
        is this trace's parent). Only while tracing is on: off, the hot path makes no span."""
        function = f"{key[1]}.{key[0]}"
        with tracing.server_span("gateway.invoke", headers, {"faas.name": function, "http.method": method}) as sp:
            with tracing.span("gateway.forward", kind="client", attributes={"faas.name": function}):
                result = self._forward(
                    key, raw_name, method, path, query, tracing.inject(dict(headers)), body, wait_for_slot, stream
                )
            tracing.set_attributes(sp, **{"http.status_code": result.status})
        return result

    def _finished(self, key: tuple[str, str], label: str, status: int, seconds: float, slo: RequestSlo) -> None:
        """One call answered: OpenFaaS's metrics, and the status page's rate and SLO tally."""
        if not self.recording:
            return
        if self.gateway_counts:
            self.metrics.finished(label, status, seconds)
        if slo.request_class is RequestClass.BEST_EFFORT:
            slo_ms = None  # a best-effort call has no SLO to meet
        elif slo.slo_ms is not None:
            slo_ms = slo.slo_ms
        else:
            record = self.provider.store.cached(*key)
            slo_ms = record.deployment.slo_ms() if record is not None else None
        self.provider.activity.record(key, status, seconds, slo_ms)

    def _forward(
        self,
        key: tuple[str, str],
        raw_name: str,
        method: str,
        path: str,
        query: str,
        headers: dict,
        body: bytes,
        wait_for_slot: bool = False,
        stream: bool = False,
    ) -> Result:
        cold_s = 0.0
        try:
            t0 = time.monotonic()
            waited = not self.invoker.runtime.endpoints(*key)  # for a replica to start or restart
            target = self.invoker.endpoint(key, self.provider.scale_from_zero, headers)
            cold_s = target.cold_s
            status = None
            streamed = None
            try:
                wait_s = float("inf") if wait_for_slot else 0.0
                if waited:  # capacity that was on its way: a short wait for it, not a 429
                    wait_s = max(wait_s, self.invoker.ready_timeout_s - (time.monotonic() - t0))
                result = self._at_replicas(key, target.url, method, path, query, headers, body, wait_s, stream)
                status = result.status
                streamed = result.stream
                self.invoker.count(key)
            finally:
                if streamed is None:
                    self.invoker.done(key, status)
            if streamed is not None:  # the dispatcher's in-flight count: until the stream ends
                streamed.at_end(lambda whole: self.invoker.done(key, status if whole else None))
            if cold_s:
                result.headers.append((h.COLD_START_SECONDS, f"{cold_s:.3f}"))
        except TooManyInFlight as exc:  # its ready replicas are full (max_inflight): refused, as they would
            result = _error(429, str(exc))
        except ColdStartTimeout as exc:  # the call said why, and how long it waited
            result = _error(
                503,
                f"No endpoints available for: {raw_name}: cold start: no replica became ready within "
                f"{exc.waited_s:.1f}s (the gateway's ready timeout); see `faas-gpu describe {key[1]}` and its logs",
            )
            result.headers.append((h.COLD_START_SECONDS, f"{exc.waited_s:.3f}"))
        except NotFound:
            result = _error(404, f"No endpoints available for: {raw_name}.")
        except Unavailable as exc:  # crash-looping or failing to start: say so at once
            result = _error(503, f"No endpoints available for: {raw_name}: {exc}")
        except BadApp as exc:  # a request class the function does not have (X-Faas-Gpu-App)
            result = _error(400, str(exc))
        except DatastoreUnavailable as exc:  # a function not known here yet, or one to scale from zero
            result = _error(503, f"{exc}; retry later")
        except ReplicaTimeout:
            after = f" (after a cold start of {cold_s:.1f}s waiting for a replica)" if cold_s else ""
            result = _error(504, f"Timeout reaching service for: {raw_name}.{after}")
            if cold_s:
                result.headers.append((h.COLD_START_SECONDS, f"{cold_s:.3f}"))
        except ReplicaError:  # refused past the ready timeout, dropped and not resent
            result = _error(502, f"Can't reach service for: {raw_name}.")
        return result

    def _at_replicas(
        self,
        key: tuple[str, str],
        url: str,
        method: str,
        path: str,
        query: str,
        headers: dict,
        body: bytes,
        wait_s: float,
        stream: bool = False,
    ) -> Result:
        """`_send`, within max_inflight's share of the ready replicas (taken now that one is ready:
        TooManyInFlight when they are full past `wait_s`; a streamed answer holds it to its end)."""
        limit = self.invoker.replicas_limit(key)
        if limit is None:
            return self._send(key, url, method, path, query, headers, body, stream)
        self.invoker.inflight.enter_replicas(key, limit, wait_s=wait_s)
        result = None
        try:
            result = self._send(key, url, method, path, query, headers, body, stream)
            return result
        finally:
            if result is not None and result.stream is not None:
                result.stream.at_end(lambda whole: self.invoker.inflight.leave_replicas(key))
            else:
                self.invoker.inflight.leave_replicas(key)

    def _send(
        self,
        key: tuple[str, str],
        url: str,
        method: str,
        path: str,
        query: str,
        headers: dict,
        body: bytes,
        stream: bool = False,
    ) -> Result:
        """Forward to `url`; a replica that refuses the connection has died (the call never reached
        it, so sending it again is safe even for a POST): the call goes to another ready replica,
        or to the one the runtime starts in its place, for up to the ready timeout.

        A replica that drops the connection before any byte of an answer (killed, its host lost,
        its container stopped mid-call) is Envoy's `retry_on: reset`: the call is sent once more,
        to a ready replica, so that a lost node loses no accepted call. Once only, so a call that
        kills every replica it reaches is not replayed across the fleet; never for a function
        annotated `com.faas-gpu.retry-on-reset: "false"` (one whose call must not run twice),
        which gets OpenFaaS's 502. A replica whose watchdog answers its own 500 for a function
        process that had gone (`lost_its_function`: a container being killed loses its handler
        first) is the same loss, under the same rule. A streamed answer (`stream`) comes back at
        its head: whatever happens to it afterwards, the call is never sent again."""
        deadline = time.monotonic() + self.invoker.ready_timeout_s
        resent = False
        while True:
            try:
                # a kept-alive connection the replica closed under the call: sent once more on a
                # fresh one where a dropped call would be resent, and not after this gateway's resend
                may_resend = (lambda: False) if resent else (lambda: self._retry_on_reset(key))
                result = self.invoker.forward(
                    url, method, path, query, headers, body, may_resend=may_resend, stream=stream
                )
                if result.status != 500 or resent or not lost_its_function(result) or not self._retry_on_reset(key):
                    return result
                # the replica's watchdog answered, but its function process had gone (a container
                # being killed stops the handler before the watchdog): the same loss as a reset
                resent = True
                log.info("%s.%s: %s lost its function process; sending the call once more", key[1], key[0], url)
                time.sleep(0.05)
                url = self._another(key, headers, url)
            except ReplicaDropped:
                if resent or not self._retry_on_reset(key):
                    raise
                resent = True
                log.info("%s.%s: %s dropped the call before answering; sending it once more", key[1], key[0], url)
                time.sleep(0.05)  # the runtime's supervisor notices a dead replica within its tick
                url = self._another(key, headers, url)
            except ReplicaRefused:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(0.05, left))
                fresh = self.invoker.pick(key, headers)
                if fresh is None and self.invoker.runtime.wait_ready(*key, max(0.0, deadline - time.monotonic())):
                    fresh = self.invoker.pick(key, headers)
                url = fresh or url

    def _another(self, key: tuple[str, str], headers: dict, lost: str) -> str:
        """Where a lost call is sent once more: a ready replica other than the one that lost it
        where there is one. The runtime still lists a replica whose node just went (Swarm notices
        a lost node seconds later) or whose container is being stopped (its watchdog accepts,
        then drops the connection again), so the one resend must not go back to it; with no
        other replica it goes to the same address (a replacement the runtime started there)."""
        for _ in range(max(2, len(self.invoker.runtime.endpoints(*key)) + 1)):
            url = self.invoker.pick(key, headers)
            if url is not None and url != lost:
                return url
        return lost

    def _retry_on_reset(self, key: tuple[str, str]) -> bool:
        record = self.provider.store.cached(*key)
        annotations = (record.deployment.annotations or {}) if record is not None else {}
        return is_true(annotations.get(RETRY_ON_RESET), default=True)

    # -- asynchronous --------------------------------------------------------------------
    def enqueue(self, environ: dict, start_response: StartResponse, rest: str) -> Iterable[bytes]:
        raw_name, _, sub = rest.partition("/")
        if environ["REQUEST_METHOD"] != "POST":
            return plain(start_response, 405, "async invocations must use POST")
        if not raw_name:
            return plain(start_response, 404, "function name is required")
        limit = self.provider.config.async_max_body_bytes
        try:
            body = read_body(environ, limit)
        except BodyTooLarge:
            return plain(start_response, 413, f"body: request body is larger than {limit} bytes")
        headers = request_headers(environ)
        callback = headers.get(h.CALLBACK_URL) or ""
        if callback:
            try:  # parsed now: anything but a plain http(s) URL is a 400 at once, never a 500 later
                parse_callback_url(callback)
            except ValueError as exc:
                return plain(start_response, 400, str(exc))
        try:
            key = self.invoker.resolve(raw_name)
        except ValueError:
            key = None
        try:
            if key is None or not self.invoker.exists(key):
                return plain(start_response, 404, f"function {raw_name} not found")
        except DatastoreUnavailable as exc:
            return plain(start_response, 503, f"{exc}; retry later", [("Retry-After", "1")])
        record = self.provider.store.cached(*key)
        problem = _async_header_problem(headers, (record.deployment.annotations or {}) if record else {})
        if problem:  # refused now: after a 202 the caller would only learn it in the callback
            return plain(start_response, 400, problem)
        call_id = headers.setdefault(h.CALL_ID, str(uuid.uuid4()))
        headers.setdefault(h.START_TIME, str(time.time_ns()))
        message = {
            "Header": {k: [v] for k, v in headers.items()},
            "Host": environ.get("HTTP_HOST", ""),
            "Body": base64.b64encode(body).decode(),
            "Method": "POST",
            "Path": "/" + sub if sub else "",
            "QueryString": environ.get("QUERY_STRING", ""),
            "Function": raw_name,
            "QueueName": "",
            "CallbackUrl": callback,
        }
        # the call id goes back on a refusal too: the caller retries with it and the call runs once
        this_call = [(h.CALL_ID, call_id)]
        try:
            self.provider.queue.put(message, call_key(key[0], key[1], call_id))
        except QueueStorageFull as exc:
            return plain(start_response, 507, str(exc), [*this_call, ("Retry-After", "10")])
        except QueueUnavailable as exc:
            return plain(start_response, 503, str(exc), [*this_call, ("Retry-After", "1")])
        start_response("202 Accepted", [*this_call, ("Content-Length", "0")])
        return []


def _async_header_problem(headers: dict[str, str], annotations: dict[str, str]) -> str | None:
    """Why the request-class headers of an async call would be refused when it runs, or None."""
    try:
        parse_request(headers)
    except ValueError as exc:
        return str(exc)
    app = headers.get(APP_HEADER)
    if app is not None and APPS in annotations:
        try:
            apps = parse_apps(annotations[APPS])
        except ValueError:  # the deploy was validated; a bad declaration is the call's to report
            return None
        if app not in apps:
            return f"{APP_HEADER}: {app[:40]!r} is not an app of this function ({', '.join(apps)})"
    return None


def lost_its_function(result: Result) -> bool:
    """A watchdog's own 500 saying it could not reach its function process (of-watchdog's
    `X-OpenFaaS-Internal: of-watchdog`, "Can't reach service for: ..."), not the function's 500."""
    internal = next((v for k, v in result.headers if k.lower() == "x-openfaas-internal"), None)
    return internal == "of-watchdog" and result.body.startswith(b"Can't reach service for")


def _gathered(result: Result, function: str) -> Result:
    """A streamed answer as a whole one; a stream that breaks is OpenFaaS's 502 (its answer had
    begun: never resent), saying how much had come."""
    stream = result.stream
    assert stream is not None
    try:
        return Result(result.status, result.headers, stream.whole_body())
    except ReplicaError as exc:
        return _error(
            502, f"Can't reach service for: {function}: its streamed answer was cut after {stream.sent} bytes ({exc})"
        )


def _error(code: int, message: str) -> Result:
    return Result(code, [("Content-Type", "text/plain; charset=utf-8"), INTERNAL], (message + "\n").encode())


class AsyncWorker:
    """The queue-worker: runs queued invocations and hands their results to the callback
    dispatcher (`provider.callbacks`), which posts them apart from these threads.

    A message stays claimed (renewed every third of the visibility timeout) until its callback
    has ended, delivered or not, then is finished: marked done and acked together. So a gateway
    killed meanwhile loses nothing (the message comes back and is run again: its first answer was
    never sent), and a call finished once is not run again (`AsyncQueue.finish`). Finishes run
    on a thread of their own, in order: one the queue cannot take now (Redis away, a full disk)
    is tried again, never dropped, and blocks no worker or callback delivery meanwhile; the
    message stays ours until then, so it is neither lost nor run twice."""

    def __init__(self, app: InvocationApp, workers: int, consumer: str, callbacks: CallbackDispatcher):
        self.app = app
        self.queue = app.provider.queue
        self.consumer = consumer
        self.callbacks = callbacks
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._held: dict[str, Delivery] = {}  # claimed and not yet finished
        self._finishing: Queue[Delivery] = Queue()
        self._closed = threading.Event()  # no callback will end any more: the finisher may stop
        self._threads = [threading.Thread(target=self._run, name=f"async-{i}", daemon=True) for i in range(workers)]
        self._threads.append(threading.Thread(target=self._renew, name="async-renew", daemon=True))
        self._finisher = threading.Thread(target=self._finish_all, name="async-finish", daemon=True)

    def start(self) -> None:
        self.callbacks.start()
        self._finisher.start()
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Claims stop, deliveries under way end (a delivery's own timeout, by default), then the
        finishes they leave are made if the queue takes them. A call whose callback was left
        queued stays claimed: the next gateway runs it and calls back."""
        timeout_s = self.callbacks.timeout_s + 5 if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.callbacks.stop(max(0.0, deadline - time.monotonic()))
        self._closed.set()
        self._finisher.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delivery = self.queue.claim(self.consumer, block_ms=500)
            except QueueUnavailable as exc:  # a full disk: what is queued waits for space
                log.warning("async queue unavailable (%s); retrying", exc)
                self._stop.wait(1.0)
                continue
            except Exception:  # the queue's server may be restarting
                log.warning("async queue unavailable; retrying", exc_info=True)
                self._stop.wait(1.0)
                continue
            if delivery is None:
                continue
            with self._lock:
                if delivery.id in self._held:  # still ours (a renewal came late): not run twice
                    continue
                self._held[delivery.id] = delivery
            try:
                if delivery.key is not None and self.queue.is_done(delivery.key):
                    log.info("async call %s was finished before; not run again", delivery.id)
                    self._finish(delivery)
                    continue
            except Exception:
                log.warning("async queue unavailable; call %s is left for later", delivery.id, exc_info=True)
                with self._lock:
                    self._held.pop(delivery.id, None)
                self._stop.wait(1.0)
                continue
            try:
                self.process(delivery)
            except Exception:
                log.exception("async invocation %s failed", delivery.id)
                self._finish(delivery)

    def _renew(self) -> None:
        """Keep held messages claimed while they run or their callbacks wait."""
        period = max(0.1, getattr(self.queue, "visibility_s", 30.0) / 3)
        while not self._stop.wait(period):
            with self._lock:
                ids = list(self._held)
            try:
                self.queue.touch(ids, self.consumer)
            except Exception as exc:
                log.warning("async queue: could not renew %d claimed calls (%s)", len(ids), exc)

    def _finish(self, delivery: Delivery) -> None:
        self._finishing.put(delivery)

    def _finish_all(self) -> None:
        while not (self._closed.is_set() and self._finishing.empty()):
            try:
                delivery = self._finishing.get(timeout=0.2)
            except Empty:
                continue
            while True:
                try:
                    self.queue.finish(delivery.id, delivery.key)
                    break
                except Exception as exc:
                    if self._closed.is_set():  # left claimed: the next gateway runs it again
                        log.warning("async call %s not finished at shutdown (%s)", delivery.id, exc)
                        break
                    log.warning("async call %s: finishing it failed (%s); trying again", delivery.id, exc)
                    self._closed.wait(1.0)
            with self._lock:
                self._held.pop(delivery.id, None)

    def process(self, delivery: Delivery) -> None:
        msg = delivery.message
        headers = {k: v[0] for k, v in (msg.get("Header") or {}).items() if v}
        body = base64.b64decode(msg.get("Body") or "")
        t0 = time.perf_counter()
        result = self.app.call(
            msg["Function"],
            msg.get("Method") or "POST",
            msg.get("Path") or "/",
            msg.get("QueryString") or "",
            headers,
            body,
            wait_for_slot=True,
            stream=True,
        )
        if result.stream is not None:  # a callback posts a whole body: the stream, gathered
            result = _gathered(result, msg["Function"])
        duration = time.perf_counter() - t0
        call_id = headers.get(h.CALL_ID, "")
        raw = msg.get("CallbackUrl")
        if not raw:
            self._finish(delivery)
            return
        try:
            url = parse_callback_url(raw)
        except ValueError as exc:  # queued by a version that did not parse it
            log.warning("callback of %s call %s not sent: %s", msg["Function"], call_id, exc)
            self._finish(delivery)
            return
        out = {k: v for k, v in result.headers if k.lower() != "content-length"}
        out.update(
            {
                h.DURATION_SECONDS: f"{duration:.6f}",
                "X-Function-Status": str(result.status),
                "X-Function-Name": msg["Function"],
                h.CALL_ID: call_id,
            }
        )

        def done(outcome: Outcome) -> None:
            self._finish(delivery)

        self.callbacks.submit(Callback(url, result.body, out, done, label=f"{msg['Function']} call {call_id}"))
