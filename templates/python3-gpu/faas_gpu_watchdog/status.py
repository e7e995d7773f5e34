"""Status lines as of-watchdog's Go server writes them, and its one log line per request.

Go's reason phrases (net/http `StatusText`): the table is `faas_gpu.contract.http_status`'s,
copied because the watchdog runs in images without faas-gpu (tests/contract/test_contract.py
holds the two equal). Python's own table (`http.server`) differs from Go's in places (413, 422 in
Python 3.13, codes Go does not know), and faas-cli prints the status line it gets verbatim.
"""

from __future__ import annotations

REASONS: dict[int, str] = {
    100: "Continue",
    101: "Switching Protocols",
    102: "Processing",
    103: "Early Hints",
    200: "OK",
    201: "Created",
    202: "Accepted",
    203: "Non-Authoritative Information",
    204: "No Content",
    205: "Reset Content",
    206: "Partial Content",
    207: "Multi-Status",
    208: "Already Reported",
    226: "IM Used",
    300: "Multiple Choices",
    301: "Moved Permanently",
    302: "Found",
    303: "See Other",
    304: "Not Modified",
    305: "Use Proxy",
    307: "Temporary Redirect",
    308: "Permanent Redirect",
    400: "Bad Request",
    401: "Unauthorized",
    402: "Payment Required",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    411: "Length Required",
    412: "Precondition Failed",
    413: "Request Entity Too Large",
    414: "Request URI Too Long",
    415: "Unsupported Media Type",
    416: "Requested Range Not Satisfiable",
    417: "Expectation Failed",
    418: "I'm a teapot",
    421: "Misdirected Request",
    422: "Unprocessable Entity",
    423: "Locked",
    424: "Failed Dependency",
    425: "Too Early",
    426: "Upgrade Required",
    428: "Precondition Required",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    451: "Unavailable For Legal Reasons",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
    506: "Variant Also Negotiates",
    507: "Insufficient Storage",
    508: "Loop Detected",
    510: "Not Extended",
    511: "Network Authentication Required",
}


def reason(code: int) -> str:
    """The reason phrase Go writes after `code` (`status code N` for a code it has no text for)."""
    return REASONS.get(code) or f"status code {code}"


def human_size(size: float) -> str:
    """docker/go-units' `HumanSize` (decimal units, 4 significant digits), as of-watchdog prints a
    response's length: `2B`, `1.234kB`, `12.35MB`."""
    units = ("B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = 0
    while size >= 1000.0 and i < len(units) - 1:
        size /= 1000.0
        i += 1
    return f"{size:.4g}{units[i]}"


def request_line(
    method: str, uri: str, code: int, length: int, seconds: float, *, text: bool, call_id: str | None
) -> str:
    """of-watchdog's line for one call, written once the function answered: in http mode (and
    inproc, which stands in for it here) with the upstream's status text, `POST / - 200 OK -
    ContentLength: 2B (0.0012s)` (executor/http_runner.go); in the forking modes the code alone
    (pkg/watchdog.go). `call_id` (`log_callid`) adds ` [<X-Call-Id or none>]`."""
    status = f"{code} {reason(code)}" if text else str(code)
    line = f"{method} {uri} - {status} - ContentLength: {human_size(length)} ({seconds:.4f}s)"
    return line if call_id is None else f"{line} [{call_id}]"
