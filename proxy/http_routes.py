"""HTTP requests and answers as values, and the route table that maps one to the other: the sans-IO half of the
admin server (proxy/admin.py). :mod:`proxy.io.http_server` reads each request off its connection (h11) and writes
the answer :meth:`Routes.answer` gives.

A path that no route has is 404; a method its path has no route for is 405 with ``Allow`` (RFC 9110 15.5.6);
``HEAD`` is answered as ``GET`` is, without the body (RFC 9110 9.3.2). A handler that raises :class:`HTTPError`
is answered with the error's response; one that raises anything else with 500 and a log event.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from .accesslog import get_logger

__all__ = ["HTTPError", "Handler", "Request", "Response", "Routes", "json_response", "text_response"]

log = get_logger("sluice.admin")


@dataclass(frozen=True, slots=True)
class Request:
    """One request, read whole (body included)."""

    method: str
    #: percent-decoded, without the query
    path: str
    #: the first value of each query parameter
    query: Mapping[str, str] = field(default_factory=dict)
    #: names in lower case; a header sent more than once has its values joined by ", " (RFC 9110 5.3)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: the caller's address
    client: str = ""
    #: the client certificate TLS verified, as :meth:`ssl.SSLSocket.getpeercert` gives it (None: none)
    certificate: Mapping[str, Any] | None = None
    #: what the server knows of its callers (proxy/admin.py's tokens); the routes never look inside
    auth: Any = None

    @classmethod
    def parse(cls, method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes = b"",
              client: str = "", certificate: Mapping[str, Any] | None = None) -> Request:
        """A request from its wire parts (h11's: the request target as sent, header names in lower case)."""
        raw_path, _, raw_query = target.decode("ascii", "replace").partition("?")
        query: dict[str, str] = {}
        for key, value in parse_qsl(raw_query, keep_blank_values=True):
            query.setdefault(key, value)
        joined: dict[str, str] = {}
        for raw_name, raw_value in headers:
            name, value = raw_name.decode("ascii", "replace").lower(), raw_value.decode("latin-1")
            joined[name] = f"{joined[name]}, {value}" if name in joined else value
        return cls(method.decode("ascii", "replace"), unquote(raw_path), query, joined, body, client, certificate)

    def json(self) -> Any:
        """The body as JSON; ``json.JSONDecodeError`` or ``UnicodeDecodeError`` when it is not (empty included)."""
        return json.loads(self.body.decode("utf-8"))


@dataclass(frozen=True, slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    #: more headers (Content-Type and Content-Length are the server's)
    headers: tuple[tuple[str, str], ...] = ()


def text_response(text: str, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(status, text.encode(), headers=tuple((headers or {}).items()))


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(value).encode(), "application/json; charset=utf-8")


class HTTPError(Exception):
    """Raised by a handler (or what it calls, e.g. :func:`proxy.admin.require_principal`): answer ``response``."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


Handler = Callable[[Request], Awaitable[Response]]


class Routes:
    """Handlers by path and method."""

    def __init__(self) -> None:
        self._paths: dict[str, dict[str, Handler]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        methods = self._paths.setdefault(path, {})
        method = method.upper()
        if method in methods:
            raise ValueError(f"{method} {path} has a handler already")
        methods[method] = handler

    def allowed(self, path: str) -> list[str]:
        """The methods ``path`` answers (HEAD wherever GET is)."""
        methods = set(self._paths.get(path, ()))
        if "GET" in methods:
            methods.add("HEAD")
        return sorted(methods)

    async def answer(self, request: Request) -> Response:
        methods = self._paths.get(request.path)
        if methods is None:
            return text_response("not found\n", 404)
        handler = methods.get(request.method) or (methods.get("GET") if request.method == "HEAD" else None)
        if handler is None:
            return text_response("method not allowed\n", 405, {"Allow": ", ".join(self.allowed(request.path))})
        try:
            return await handler(request)
        except HTTPError as e:
            return e.response
        except Exception as e:  # a bug in one handler: this request's 500, the server carries on
            log.error("admin_handler_failed", method=request.method, path=request.path, error=repr(e),
                      exc_info=True)
            return text_response("internal server error\n", 500)
