"""A stand-in for the OpenFaaS gateway the CLI talks to: it answers as OPENFAAS.md §1.1/§1.3/§1.4
say a provider does (202 for writes, 404 for unknown functions, NDJSON logs) and records every
call, so the CLI tests check the exact REST calls faas-cli would make."""

from __future__ import annotations

import json
import threading

from flask import Flask, Response, request
from werkzeug.serving import make_server


class Stub:
    """A provider stand-in: records (method, path, query, json, auth) and answers per a table."""

    def __init__(self):
        self.calls: list[dict] = []
        self.functions: dict[str, dict] = {}
        self.answers: dict[tuple[str, str], tuple[int, str]] = {}
        app = Flask("stub")

        @app.route("/<path:path>", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
        def any_route(path):
            path = "/" + path
            body = request.get_data()
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = body.decode(errors="replace")
            self.calls.append(
                {
                    "method": request.method,
                    "path": path,
                    "query": request.args.to_dict(),
                    "json": parsed,
                    "auth": request.headers.get("Authorization"),
                    "headers": dict(request.headers),
                }
            )
            if (request.method, path) in self.answers:
                code, text = self.answers[(request.method, path)]
                return Response(text, status=code)
            return self.default(request.method, path, parsed)

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def default(self, method: str, path: str, body):
        if path == "/system/functions":
            if method == "GET":
                return Response(json.dumps(list(self.functions.values())), mimetype="application/json")
            if method == "POST":
                self.functions[body["service"]] = self._status(body)
                return Response("", status=202)
            if method == "PUT":
                if body["service"] not in self.functions:
                    return Response("function not found", status=404)
                self.functions[body["service"]] = self._status(body)
                return Response("", status=202)
            if method == "DELETE":
                if self.functions.pop(body["functionName"], None) is None:
                    return Response(f"function {body['functionName']} not found", status=404)
                return Response("", status=202)
        if path.startswith("/system/function/"):
            fn = self.functions.get(path.rsplit("/", 1)[1])
            if fn is None:
                return Response("", status=404)
            return Response(json.dumps({**fn, "invocationCount": 0}), mimetype="application/json")
        if path == "/system/secrets":
            if method == "GET":
                return Response(json.dumps([{"name": "api-key", "namespace": "openfaas-fn"}]))
            return Response("", status=202)
        if path == "/system/logs":
            lines = [
                {"name": "echo", "namespace": "openfaas-fn", "instance": "echo-1", "timestamp": "T1", "text": "a\n"},
                {"name": "echo", "namespace": "openfaas-fn", "instance": "echo-2", "timestamp": "T2", "text": "b"},
            ]
            return Response("".join(json.dumps(m) + "\n" for m in lines), mimetype="application/x-ndjson")
        if path == "/system/info":
            info = {"provider": "faas-gpu", "orchestration": "local", "version": {"sha": "abc", "release": "0.1.0"}}
            return Response(json.dumps({"provider": info, "version": {"sha": "g", "release": "0.27"}, "arch": ""}))
        if path.startswith("/function/"):
            return Response(b"echo:" + request.get_data(), status=200, headers={"X-Call-Id": "c1"})
        if path.startswith("/async-function/"):
            return Response("", status=202, headers={"X-Call-Id": "c2"})
        return Response("not found", status=404)

    @staticmethod
    def _status(dep: dict) -> dict:
        return {
            "name": dep["service"],
            "image": dep["image"],
            "replicas": 1,
            "availableReplicas": 1,
            **{k: v for k, v in dep.items() if k not in ("service",)},
        }

    def stop(self):
        self.server.shutdown()

    def only(self, method: str | None = None) -> list[tuple[str, str]]:
        return [(c["method"], c["path"]) for c in self.calls if method is None or c["method"] == method]
