"""The request line and headers, read without the e-mail package.

`BaseHTTPRequestHandler.parse_request` reads headers through `http.client.parse_headers`, the
e-mail package's feed parser: ~0.1 ms of CPU a request, a tenth of what the whole watchdog costs
serving a batched GPU call in process (issue 20). This reads the same lines into `Headers`, which
has what the watchdog and a handler use of `email.message.Message` (`get`, `get_all`, `items`,
`keys`, `[]`, `in`). It answers what the standard parser answers to bad input: 400 for a request
line or header line it cannot read (obsolete line folding included: RFC 9112 lets a server reject
it), 431 for a line over 64 KiB or over 100 headers, 505 for an HTTP version other than 1.x.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from http import HTTPStatus

MAX_LINE = 65536  # http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 5.6.2: a field name is a token
_VERSION = re.compile(r"HTTP/(\d+)\.(\d+)")


class Headers:
    """Case-insensitive, in arrival order; a repeated header keeps every value (`items`,
    `get_all`); `get` and `[]` give the first, as `email.message.Message` does (`[]` gives None
    for a missing one, as it does too)."""

    __slots__ = ("_items", "_first")

    def __init__(self, items: list[tuple[str, str]]):
        self._items = items
        self._first: dict[str, str] = {}
        for k, v in items:
            self._first.setdefault(k.lower(), v)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._first.get(key.lower(), default)

    def __getitem__(self, key: str) -> str | None:
        return self._first.get(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._first

    def get_all(self, key: str, failobj: list[str] | None = None) -> list[str] | None:
        low = key.lower()
        return [v for k, v in self._items if k.lower() == low] or failobj

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def keys(self) -> list[str]:
        return [k for k, _ in self._items]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._items)


def parse_request(h) -> bool:
    """`BaseHTTPRequestHandler.parse_request` for HTTP/1.0 and 1.1 with `Headers`: sets
    `command`, `path`, `request_version`, `headers`, `close_connection`; False (an error sent)
    when the request cannot be read."""
    h.command = None
    h.request_version = "HTTP/1.0"  # what an error answer is written as (HTTP/0.9 is not served)
    h.close_connection = True
    requestline = str(h.raw_requestline, "iso-8859-1").rstrip("\r\n")
    h.requestline = requestline
    words = requestline.split()
    if len(words) != 3:
        h.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({requestline!r})")
        return False
    command, path, version = words
    number = _VERSION.fullmatch(version)
    if number is None:
        h.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
        return False
    if number.group(1) != "1":
        h.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({version[5:]})")
        return False
    h.command, h.path, h.request_version = command, path, version
    items: list[tuple[str, str]] = []
    readline = h.rfile.readline
    while True:
        line = readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            h.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
            return False
        if line in (b"\r\n", b"\n", b""):
            break
        if len(items) >= MAX_HEADERS:
            h.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
            return False
        name, sep, value = line.decode("iso-8859-1").partition(":")
        if not sep or _TOKEN.fullmatch(name) is None:  # no colon, a space before it, or a folded line
            h.send_error(HTTPStatus.BAD_REQUEST, f"Bad header line ({line[:80]!r})")
            return False
        items.append((name, value.strip(" \t\r\n")))
    h.headers = headers = Headers(items)
    conntype = (headers.get("Connection") or "").lower()
    h.close_connection = conntype == "close" if version != "HTTP/1.0" else conntype != "keep-alive"
    if (headers.get("Expect") or "").lower() == "100-continue" and version != "HTTP/1.0":
        return h.handle_expect_100()
    return True
