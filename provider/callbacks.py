"""Callbacks of async invocations (`X-Callback-Url`): where they may go, and how they are sent.

Why a module of its own: a callback is a request the stack makes on a caller's behalf, to an
address the caller chose. Sent with an ordinary HTTP client from the invocation workers it was
two holes (issue 41). It reached whatever the gateway could reach: an anonymous caller had the
`echo` function post etcd's JSON put of a forged function record to etcd on loopback, and the
provider then ran that record's command as root. And a target that accepted and never answered
held, 30 s a call, the four workers every other caller's async calls needed (~5 minutes behind
40 such calls). So, here:

- The URL is parsed when the call is queued (`parse_callback_url`): anything but a plain
  http(s) URL with a host is a 400 naming the header, never a 500 later.
- Where it may go (`CallbackPolicy`): not to loopback, link-local, private (RFC 1918, ULA, CGNAT),
  unspecified, multicast or reserved addresses, nor to IPv6 forms that carry one of those (IPv4
  mapped, NAT64, 6to4), nor to the stack's own addresses (where it listens, the hosts of its
  etcd, Redis and schedulers), unless the operator allows them by name (`--callback-allow`).
  The endpoints of the stack's datastore, queue and schedulers stay closed even then.
- The check is on the address actually connected to: the name is resolved once, every address
  it gave is checked, and the connection is made to a checked address (Host header and TLS SNI
  and certificate check keep the name), so DNS cannot change its answer between check and
  connect. Redirects are not followed: OpenFaaS's queue-worker posts once, so do we.
- Delivery runs on threads of its own (`CallbackDispatcher`), apart from the invocation workers:
  a few at a time per target (host:port), targets served in turn, each target's backlog bounded
  (the oldest dropped, with a log line) and all of them bounded in bytes. Every delivery is
  bounded in time (connect, then the whole exchange) and in what is read back: the status line
  only, never the body, so a huge answer costs nothing and a trickling one times out.
"""

from __future__ import annotations

import collections
import concurrent.futures
import fcntl
import http.client
import ipaddress
import logging
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from faas_gpu.contract import headers as h

log = logging.getLogger(__name__)

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

MAX_URL_CHARS = 2048
"""Longer is refused: browsers and proxies stop near here, and it keeps a queued call small."""
MAX_STATUS_LINE = 8192
"""What is read of an answer at most: its status line (the body is never read)."""
CONNECT_TIMEOUT_S = 3.0
TIMEOUT_S = 10.0
"""One delivery's whole exchange: connect, send, and the answer's status line."""
THREADS = 16
PER_TARGET = 4
"""Deliveries in flight to one target (host:port) at once."""
BACKLOG_PER_TARGET = 1000
MAX_BACKLOG_BYTES = 256 * 1024 * 1024
"""All queued callbacks' bodies together; past it the longest backlog loses its oldest."""
RESOLVE_SERVERS_S = 60.0
"""How often the stack's servers' names are resolved again (`CallbackPolicy.servers`)."""

CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"),)
"""The well-known NAT64 prefix: DNS64 gives public IPv4 hosts such addresses on IPv6-only networks.
(The local-use 64:ff9b:1::/48 stays refused: what it translates to is the network's business.)"""
_IPV4_COMPAT = ipaddress.ip_network("::/96")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
"""A label an IPv4 parser reads as a number (inet_aton: 127.1, 2130706433, 0x7f.1)."""
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length", "host"}
)


def _bad(message: str) -> ValueError:
    return ValueError(f"{h.CALLBACK_URL}: {message}")


# -- the URL ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallbackUrl:
    """A parsed `X-Callback-Url`: what a delivery connects to and what it sends in the request line."""

    raw: str
    scheme: str
    host: str
    """A lower-case DNS name without its trailing dot, or an IP literal (IPv6 without brackets)."""
    port: int
    target: str
    """The request line's path and query."""

    @property
    def ip(self) -> IP | None:
        """The host as an address, when it is an IP literal."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def key(self) -> str:
        """The target a backlog and a concurrency limit belong to: host:port."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"


def _check_name(host: str) -> str:
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253:
        raise _bad(f"host {host!r} is not a host name")
    if _NUMBER.fullmatch(name.rsplit(".", 1)[-1]):  # an IPv4 address, then only as a dotted quad
        try:
            return str(ipaddress.IPv4Address(name))
        except ValueError:
            raise _bad(f"host {host!r}: write an IPv4 address as four decimal numbers (a.b.c.d)") from None
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise _bad(f"host {host!r} is not a host name (letters, digits, '-' in labels of at most 63)")
    return name


def parse_callback_url(raw: str) -> CallbackUrl:
    """The callback URL of an async call, or ValueError whose message starts with the header's name.

    Only what any client would read the same way passes: printable ASCII (international names in
    punycode), http or https, a host, no user information (`http://trusted@127.0.0.1/` is a
    classic disguise), a port from 1 to 65535, no backslashes, IPv4 in its dotted-quad form."""
    if len(raw) > MAX_URL_CHARS:
        raise _bad(f"longer than {MAX_URL_CHARS} characters")
    if not raw or any(not 0x21 <= ord(c) <= 0x7E for c in raw):
        raise _bad("must be a URL of printable ASCII without spaces (percent-encode the rest)")
    if "\\" in raw:
        raise _bad("backslashes are not allowed in the URL")
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise _bad(f"{raw[:100]!r} is not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.netloc:
        raise _bad(f"{raw[:100]!r} is not an http(s) URL")
    if "@" in parts.netloc:
        raise _bad("user information (user@host) is not allowed")
    if parts.netloc.startswith("["):
        inside = parts.netloc[1:].partition("]")[0]
        if "%" in inside:
            raise _bad("IPv6 zone identifiers are not allowed")
        try:
            host = str(ipaddress.IPv6Address(inside))
        except ValueError:
            raise _bad(f"{inside!r} is not an IPv6 address") from None
    else:
        host = _check_name((parts.hostname or "").lower())
    if port == 0:
        raise _bad("port 0 is not a port")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not target.startswith("/"):
        raise _bad(f"path {parts.path[:100]!r} must start with /")
    return CallbackUrl(raw, scheme, host, port or (443 if scheme == "https" else 80), target)


# -- where a callback may go ---------------------------------------------------------------------
def _embedded_v4(ip: IP) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for, where it stands for one: IPv4-mapped
    (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d) and 6to4 (2002:AABB:CCDD::)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _NAT64) or (ip in _IPV4_COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def special_kind(ip: IP) -> str | None:
    """Why an address is not a public one a callback may reach by default, or None."""
    inner = _embedded_v4(ip)
    if inner is not None:
        why = special_kind(inner)
        if why is not None:
            return f"{why} (as {ip})"
        if ip.ipv4_mapped is not None or ip.sixtofour is not None or any(ip in net for net in _NAT64):
            return None  # a public IPv4 address written in IPv6: the IPv4 address decides
    checks = (
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local"),
        (ip.is_multicast, "multicast"),
        (ip in CGNAT if ip.version == 4 else False, "shared address space (CGNAT)"),
        (ip.is_private, "private"),
        (ip.is_reserved, "reserved"),
        (not ip.is_global, "not globally routable"),
    )
    return next((why for hit, why in checks if hit), None)


def parse_allow(entries: Iterable[str], source: str = "--callback-allow") -> tuple[frozenset[str], tuple[Network, ...]]:
    """Host names and networks (IPs and CIDRs) from allow entries, each possibly a comma list;
    ValueError naming `source` for an entry that is neither."""
    names: set[str] = set()
    networks: list[Network] = []
    for entry in entries:
        for item in entry.split(","):
            item = item.strip()
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            try:
                names.add(_check_name(item.lower()))
            except ValueError:
                raise ValueError(f"{source}: {item!r} is neither a host name, an IP address nor a CIDR") from None
    return frozenset(names), tuple(networks)


@dataclass(frozen=True)
class CallbackPolicy:
    """Which addresses a callback may be sent to (see the module's docstring).

    `own_addresses`: where the stack itself listens and the hosts it talks to (refused unless
    allowed); `closed_endpoints`: (address, port) of its datastore, queue and schedulers, which no
    allow entry opens (nothing there is a callback's business, and reaching them was the attack);
    `own_names`: those hosts' names as configured (refused by name too, unless allowed by name);
    `servers`: (name, port) of the servers named rather than addressed, whose addresses
    `resolved` adds (a name such as `etcd` in a compose file may not resolve yet when the gateway
    starts, or may move)."""

    allowed_names: frozenset[str] = frozenset()
    allowed_networks: tuple[Network, ...] = ()
    own_addresses: frozenset[IP] = frozenset()
    own_names: frozenset[str] = frozenset()
    closed_endpoints: frozenset[tuple[IP, int]] = frozenset()
    servers: tuple[tuple[str, int], ...] = ()

    def resolved(self, addresses_of: Callable[[str], set[IP]], local: set[IP] | None = None) -> CallbackPolicy:
        """This policy with the servers' current addresses closed too (`local`: this host's)."""
        own, closed = set(self.own_addresses), set(self.closed_endpoints)
        for host, port in self.servers:
            found = addresses_of(host)
            own |= found
            for ip in found:
                closed |= closing(ip, port, local or set())
        return replace(self, own_addresses=frozenset(own), closed_endpoints=frozenset(closed))

    def refusal(self, url: CallbackUrl, addresses: Iterable[IP]) -> str | None:
        """Why a callback to `url`, resolved to `addresses`, is refused; None: it may be sent to any of them."""
        addresses = list(addresses)
        if not addresses:
            return f"{url.host} has no address"
        by_name = url.host in self.allowed_names
        if url.host in self.own_names and not by_name:
            return f"{url.host} is one of the stack's own hosts"
        for ip in addresses:
            plain = _embedded_v4(ip) or ip
            if (_endpoint(ip), url.port) in self.closed_endpoints:
                return f"{ip} port {url.port} is the stack's own datastore, queue or scheduler"
            if by_name or any(ip in net or plain in net for net in self.allowed_networks):
                continue
            if ip in self.own_addresses or plain in self.own_addresses:
                return f"{ip} is one of the stack's own addresses"
            why = special_kind(ip)
            if why is not None:
                return f"{ip} is {why}"
        return None


_LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


def _endpoint(ip: IP) -> IP:
    """The address a closed endpoint is known by: IPv6 forms as their IPv4 address, and every
    loopback address as 127.0.0.1 (a server on loopback may listen on all of them, or on ::1)."""
    plain = _embedded_v4(ip) or ip
    return _LOOPBACK if plain.is_loopback else plain


def closing(ip: IP, port: int, local: set[IP]) -> set[tuple[IP, int]]:
    """The endpoints that reach a server at `ip`:`port`: itself, and loopback where it is this host."""
    out = {(_endpoint(ip), port)}
    if ip in local:
        out.add((_LOOPBACK, port))
    return out


def local_addresses() -> set[IP]:
    """This host's interface addresses (Linux), for a stack bound to every one of them."""
    out: set[IP] = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            out.add(ipaddress.IPv6Address(int(raw, 16)))
    except (OSError, ValueError, IndexError):
        pass
    siocgifaddr = 0x8915
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
                    out.add(ipaddress.IPv4Address(packed[20:24]))
                except OSError:
                    continue  # an interface without an IPv4 address
    except OSError:
        pass
    return out


def _host_port(url: str, default_port: int) -> tuple[str, int] | None:
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urlsplit(url)
        return (parts.hostname or "", parts.port or default_port) if parts.hostname else None
    except ValueError:
        return None


def _addresses_of(host: str) -> set[IP]:
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        pass
    try:
        return {ipaddress.ip_address(info[4][0].partition("%")[0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError, ValueError):
        return set()


def stack_policy(
    allow: Iterable[str],
    *,
    binds: Iterable[str],
    etcd_url: str | None = None,
    redis_url: str | None = None,
    scheduler_url: str | None = None,
) -> CallbackPolicy:
    """The policy of a stack that listens on `binds` and talks to these servers."""
    names, networks = parse_allow(allow)
    local = local_addresses()
    own: set[IP] = set()
    for bind in binds:
        try:
            ip = ipaddress.ip_address(bind.strip("[]"))
        except ValueError:
            own |= _addresses_of(bind)
            continue
        own |= local if ip.is_unspecified else {ip}
    servers: list[tuple[str, int]] = []
    for part in (etcd_url or "").split(","):
        if part.strip() and part.strip() != "embedded":
            servers.append(_host_port(part.strip().replace("etcd://", "http://"), 2379) or ("", 0))
    if redis_url and redis_url.startswith(("redis://", "rediss://")):
        servers.append(_host_port(redis_url, 6379) or ("", 0))
    for part in (scheduler_url or "").split(","):
        if part.strip():
            servers.append(_host_port(part.strip(), 80) or ("", 0))
    own_names: set[str] = set()
    closed: set[tuple[IP, int]] = set()
    named: list[tuple[str, int]] = []
    for host, port in servers:
        if not host:
            continue
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            own_names.add(host.lower().rstrip("."))
            named.append((host, port))
            continue
        own.add(ip)
        closed |= closing(ip, port, local)
    policy = CallbackPolicy(names, networks, frozenset(own), frozenset(own_names), frozenset(closed), tuple(named))
    return policy.resolved(_addresses_of, local)


# -- one delivery ------------------------------------------------------------------------------
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _resolvers() -> concurrent.futures.ThreadPoolExecutor:
    """Where names are resolved (getaddrinfo has no timeout of its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="callback-dns")
        return _pool


def resolve(host: str, port: int) -> list[str]:
    """Every address of `host`, each once, in the resolver's order (an IP literal is itself)."""
    seen: dict[str, None] = {}
    for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        seen.setdefault(info[4][0].partition("%")[0])
    return list(seen)


@dataclass(frozen=True)
class Outcome:
    result: str
    """`delivered` (the target answered; any status), `refused` (by the policy, not sent),
    `failed` (no answer: unreachable, timed out, not HTTP) or `dropped` (a full backlog's oldest)."""
    status: int | None = None
    detail: str = ""


class _Expired(Exception):
    pass


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Expired
    return left


def _read_status(sock: socket.socket, deadline: float) -> int:
    """The status code of the answer on `sock`, reading its status line and nothing more, each
    read bounded by what is left of the delivery's time (a trickle cannot stretch it)."""
    data = b""
    while b"\n" not in data:
        if len(data) > MAX_STATUS_LINE:
            raise ValueError("the answer's status line is too long")
        sock.settimeout(_left(deadline))
        chunk = sock.recv(1024)
        if not chunk:
            raise ValueError("the target closed the connection without answering")
        data += chunk
    line = data.split(b"\n", 1)[0].decode("latin-1").strip()
    m = re.fullmatch(r"HTTP/\d(?:\.\d)? (\d{3})(?: .*)?", line)
    if not m:
        raise ValueError(f"not an HTTP answer: {line[:80]!r}")
    return int(m.group(1))


def _connect(addresses: list[str], port: int, deadline: float, connect_timeout_s: float) -> socket.socket:
    last: Exception | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=min(connect_timeout_s, _left(deadline)))
        except OSError as exc:
            last = exc
    raise last or OSError("no address to connect to")


def deliver(
    url: CallbackUrl,
    body: bytes,
    headers: dict[str, str],
    policy: CallbackPolicy,
    *,
    resolver: Resolver = resolve,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    timeout_s: float = TIMEOUT_S,
    ssl_context: ssl.SSLContext | None = None,
) -> Outcome:
    """POST `body` to `url` once, if the policy lets it go there; never raises. `ssl_context`:
    the system's trust store and hostname check unless given (a test's own CA)."""
    deadline = time.monotonic() + timeout_s
    try:
        if url.ip is not None:
            addresses = [url.host]
        else:  # on a pool of its own: a name server that never answers costs this delivery its time, no more
            addresses = _resolvers().submit(resolver, url.host, url.port).result(min(connect_timeout_s, timeout_s))
        ips = [ipaddress.ip_address(a) for a in addresses]
    except concurrent.futures.TimeoutError:
        return Outcome(
            "failed", detail=f"cannot resolve {url.host}: no answer within {min(connect_timeout_s, timeout_s):g}s"
        )
    except (OSError, UnicodeError, ValueError) as exc:
        return Outcome("failed", detail=f"cannot resolve {url.host}: {exc}")
    why = policy.refusal(url, ips)
    if why is not None:
        return Outcome("refused", detail=why)
    held: list[socket.socket] = []
    expired = threading.Event()

    def cut() -> None:  # each read has its timeout; this bounds their sum (a trickled handshake or answer)
        expired.set()
        for s in held:
            try:
                socket.socket.shutdown(s, socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout_s, cut)
    timer.daemon = True
    timer.start()
    late = Outcome("failed", detail=f"no answer within {timeout_s:g}s")
    try:
        sock = _connect([str(ip) for ip in ips], url.port, deadline, connect_timeout_s)
        held.append(sock)
        if url.scheme == "https":
            context = ssl_context or ssl.create_default_context()
            sock.settimeout(_left(deadline))
            sock = context.wrap_socket(sock, server_hostname=url.host)
            held.append(sock)
        if expired.is_set():
            return late
        conn = http.client.HTTPConnection(url.host, url.port)  # writes the request; `sock` is the checked address's
        conn.sock = sock
        sock.settimeout(_left(deadline))  # sendall's timeout is the whole send's
        conn.putrequest("POST", url.target, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", url.host_header)
        for name, value in headers.items():
            if name.lower() in _HOP_BY_HOP:
                continue
            try:
                conn.putheader(name, value)
            except ValueError:  # a name or value no HTTP header may have: left out, not sent broken
                continue
        conn.putheader("Content-Length", str(len(body)))
        conn.putheader("Connection", "close")
        conn.endheaders(body)
        return Outcome("delivered", status=_read_status(sock, deadline))
    except (_Expired, TimeoutError):
        return late
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return late if expired.is_set() else Outcome("failed", detail=f"{type(exc).__name__}: {exc}")
    finally:
        timer.cancel()
        for s in held:
            s.close()


# -- delivering many, fairly -----------------------------------------------------------------------
@dataclass
class Callback:
    url: CallbackUrl
    body: bytes
    headers: dict[str, str]
    done: Callable[[Outcome], None]
    """Called once with how it ended (delivered, refused, failed or dropped)."""
    label: str = ""
    """What the log lines name: the function and the call id."""


class CallbackDispatcher:
    """Delivers callbacks on threads of its own: at most `per_target` at once to one host:port,
    targets taken in turn (round robin over those with work), each target's backlog at most
    `backlog_per_target` (a new one pushes out the oldest) and all bodies queued at most
    `max_bytes`. A target that never answers thus costs `per_target` threads for `timeout_s`
    each, and every other target keeps its turn."""

    def __init__(
        self,
        policy: CallbackPolicy,
        *,
        threads: int = THREADS,
        per_target: int = PER_TARGET,
        backlog_per_target: int = BACKLOG_PER_TARGET,
        max_bytes: int = MAX_BACKLOG_BYTES,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        timeout_s: float = TIMEOUT_S,
        resolver: Resolver = resolve,
    ):
        self.policy = policy
        self._base_policy = policy
        self._resolved_at = time.monotonic()
        self.per_target = per_target
        self.backlog_per_target = backlog_per_target
        self.max_bytes = max_bytes
        self.connect_timeout_s, self.timeout_s = connect_timeout_s, timeout_s
        self.resolver = resolver
        self._queues: dict[str, collections.deque[Callback]] = {}
        self._turns: collections.deque[str] = collections.deque()  # targets with queued work, in turn
        self._inflight: collections.Counter[str] = collections.Counter()
        self._bytes = 0
        self._cond = threading.Condition()
        self._stop = False
        self._threads = [threading.Thread(target=self._run, name=f"callback-{i}", daemon=True) for i in range(threads)]

    def start(self) -> CallbackDispatcher:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 5) -> None:
        """No new deliveries start; queued ones are left (their calls are not acked: a restarted
        gateway runs and calls them back). Waits up to `timeout_s` in all for those under way."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def pending(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values()) + sum(self._inflight.values())

    def submit(self, callback: Callback) -> None:
        dropped: list[Callback] = []
        key = callback.url.key
        with self._cond:
            queue = self._queues.setdefault(key, collections.deque())
            if not queue:
                self._turns.append(key)
            queue.append(callback)
            self._bytes += len(callback.body)
            if len(queue) > self.backlog_per_target:
                dropped.append(self._pop(key))
            while self._bytes > self.max_bytes and self._queues:
                longest = max(self._queues, key=lambda k: len(self._queues[k]))
                dropped.append(self._pop(longest))
            self._cond.notify()
        for old in dropped:
            log.warning(
                "callback dropped: %s (%s): %s's backlog is full; its oldest goes",
                old.url.raw[:200],
                old.label,
                old.url.key,
            )
            self._done(old, Outcome("dropped", detail="the target's backlog was full"))

    def _pop(self, key: str) -> Callback:
        """The oldest callback queued for `key` (the lock held)."""
        queue = self._queues[key]
        callback = queue.popleft()
        self._bytes -= len(callback.body)
        if not queue:
            del self._queues[key]
            self._turns.remove(key)
        return callback

    def _next(self) -> Callback | None:
        """The next callback to deliver: the first target in turn with a free slot (lock held)."""
        for _ in range(len(self._turns)):
            key = self._turns[0]
            self._turns.rotate(-1)  # its turn is used, or skipped while full: it goes last
            if self._inflight[key] < self.per_target:
                callback = self._pop(key)
                self._inflight[key] += 1
                return callback
        return None

    def _policy(self) -> CallbackPolicy:
        """The policy, its servers' names resolved again once a minute."""
        if self._base_policy.servers and time.monotonic() - self._resolved_at > RESOLVE_SERVERS_S:
            self._resolved_at = time.monotonic()
            self.policy = self._base_policy.resolved(_addresses_of, local_addresses())
        return self.policy

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (callback := self._next()) is None:
                    self._cond.wait()
                if self._stop:
                    return
            try:
                outcome = deliver(
                    callback.url,
                    callback.body,
                    callback.headers,
                    self._policy(),
                    resolver=self.resolver,
                    connect_timeout_s=self.connect_timeout_s,
                    timeout_s=self.timeout_s,
                )
            except Exception as exc:  # deliver never raises; a bug here must not lose the thread
                log.exception("callback to %s", callback.url.key)
                outcome = Outcome("failed", detail=str(exc))
            with self._cond:
                self._inflight[callback.url.key] -= 1
                if not self._inflight[callback.url.key]:
                    del self._inflight[callback.url.key]
                self._cond.notify_all()
            if outcome.result == "refused":
                log.warning("callback refused: %s (%s): %s", callback.url.raw[:200], callback.label, outcome.detail)
            elif outcome.result == "failed":
                log.warning("callback to %s failed (%s): %s", callback.url.key, callback.label, outcome.detail)
            self._done(callback, outcome)

    @staticmethod
    def _done(callback: Callback, outcome: Outcome) -> None:
        try:
            callback.done(outcome)
        except Exception:
            log.exception("after the callback of %s", callback.label)
