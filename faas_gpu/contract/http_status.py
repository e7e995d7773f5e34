"""HTTP status lines as Go's net/http writes them: one table of reason phrases.

Why a table of our own: every server OpenFaaS users meet is Go's (the gateway, faas-provider,
of-watchdog), and faas-cli prints the status line it gets verbatim. Python's tables differ from
Go's (werkzeug upper-cases and names 511 "Network Authentication Failed", Python 3.13 renamed 413
and 422, `http.server` knows other codes), and a table written by hand for the codes one module
expected missed the ones it did not (`401 Unknown`). Go writes `<code> status code <code>` for a
code it has no text for (net/http `writeStatusLine`), and so do we.

The watchdog (templates/python3-gpu) runs without faas-gpu and keeps a copy of this table, which
`tests/contract/test_contract.py` holds to this one.
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
"""net/http's `StatusText` (status.go)."""


def reason(code: int) -> str:
    """The reason phrase Go writes after `code`."""
    return REASONS.get(code) or f"status code {code}"


def status_line(code: int) -> str:
    """`<code> <reason>`, as a WSGI status or after `HTTP/1.1 `."""
    return f"{code} {reason(code)}"
