"""proxy/http_routes.py without sockets: requests parsed from their wire parts, and the route table's answers (404,
405 with Allow, HEAD as GET, a handler's HTTPError, a failing handler's 500)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from proxy.http_routes import HTTPError, Request, Response, Routes, json_response, text_response


def test_a_request_from_its_wire_parts() -> None:
    request = Request.parse(b"PUT", b"/size%2Dlimits?dry_run=1&dry_run=0&empty=",
                            [(b"authorization", b"Bearer t"), (b"x-seen", b"a"), (b"X-Seen", b"b")], b'{"a": 1}',
                            "10.0.0.1")
    assert (request.method, request.path, request.client) == ("PUT", "/size-limits", "10.0.0.1")
    assert request.query == {"dry_run": "1", "empty": ""}  # the first value of each parameter
    assert request.headers == {"authorization": "Bearer t", "x-seen": "a, b"}
    assert request.json() == {"a": 1}
    with pytest.raises(ValueError):  # JSONDecodeError is one
        Request("PUT", "/", body=b"").json()
    with pytest.raises(UnicodeDecodeError):
        Request("PUT", "/", body=b"\xff").json()


async def test_the_route_table_answers() -> None:
    async def get(request: Request) -> Response:
        return json_response({"path": request.path})

    async def refuse(_request: Request) -> Response:
        raise HTTPError(text_response("no\n", 401, {"WWW-Authenticate": "Bearer"}))

    async def broken(_request: Request) -> Response:
        raise KeyError("bug")

    routes = Routes()
    routes.add("GET", "/a", get)
    routes.add("put", "/a", refuse)
    routes.add("POST", "/b", broken)
    with pytest.raises(ValueError):
        routes.add("GET", "/a", get)
    assert await routes.answer(Request("GET", "/a")) == Response(200, b'{"path": "/a"}',
                                                                 "application/json; charset=utf-8")
    assert (await routes.answer(Request("HEAD", "/a"))).body == b'{"path": "/a"}'  # the server sends no body
    assert await routes.answer(Request("PUT", "/a")) == text_response("no\n", 401, {"WWW-Authenticate": "Bearer"})
    assert (await routes.answer(Request("GET", "/c"))).status == 404
    assert (await routes.answer(Request("DELETE", "/a"))).headers == (("Allow", "GET, HEAD, PUT"),)
    assert (await routes.answer(Request("GET", "/b"))).headers == (("Allow", "POST"),)
    with capture_logs() as logs:
        assert (await routes.answer(Request("POST", "/b"))).status == 500
    assert [(e["event"], e["path"], e["error"]) for e in logs] == [("admin_handler_failed", "/b", "KeyError('bug')")]
