"""The policy chain a proxy builds from its settings, driven by hand: no sockets, no broker, an injected clock.

For unit tests of the policies and the chain (tests of the connection core add a fake port on top, see
tests/unit/test_connection.py).
"""

from __future__ import annotations

from typing import Any

from proxy.accesslog import AccessLog
from proxy.app import Settings, load_settings
from proxy.core.chain import Chain, ChainConnection
from proxy.core.exchange import ConnectionInfo, Exchange
from proxy.core.policy import Policy, Services
from proxy.core.routing import Router
from proxy.core.topic_names import TopicNames
from proxy.metrics import Metrics
from proxy.policies import build, dynamic_sections


class Clock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SansIOProxy:
    def __init__(self, overrides: dict[str, Any] | None = None, *, router: Router | None = None,
                 clock: Clock | None = None, access_log: AccessLog | None = None,
                 model: type[Settings] = Settings) -> None:
        """``model``: the settings model (and so the policies) to build from, e.g. one composed with a policy of
        another package (``proxy.config.compose(proxy.app.chain_of(...))``)."""
        self.settings = load_settings(None, env={}, model=model).with_overrides(overrides or {})
        self.metrics = Metrics()
        self.clock = clock or Clock()
        self.router = router or Router("proxy.example", 20000)
        self.names = TopicNames(self.clock)
        services = Services(self.metrics, self.clock, self.router, self.names)
        self.chain = Chain(build(self.settings, services), self.metrics, self.names, access_log or AccessLog("off"))
        self.conn = self.connect()

    def connect(self, conn_id: int = 1, host: str = "10.0.0.1") -> ChainConnection:
        return self.chain.connect(ConnectionInfo(conn_id, "bootstrap", client_host=host))

    def apply_dynamic(self, settings: Any) -> None:
        """New run-time sections, applied as ``Proxy.apply_dynamic`` applies them."""
        self.settings = settings
        self.chain.reconfigure(dynamic_sections(settings, self.chain.policies))

    def policy(self, name: str) -> Any:
        found: list[Policy] = [p for p in self.chain.policies if p.name == name]
        return found[0]

    def request(self, frame: bytes, conn: ChainConnection | None = None) -> Exchange:
        """Classify and run the request side (topic names must be known: tests teach ``names`` first), resumed
        after each piece of work a policy waits for, as the connection core does (the test's fakes must have
        settled it: Services.broker's ``on_work``)."""
        ex = self.chain.classify(frame, self.clock(), (conn or self.conn).info)
        assert not ex.missing_names, f"unknown topic ids {ex.missing_names}"
        self.chain.on_request(conn or self.conn, ex)
        while ex.pending is not None:
            assert ex.pending.settled, "a policy waits for work nothing did"
            self.chain.on_request(conn or self.conn, ex)
        return ex

    def respond(self, ex: Exchange, frame: bytes | bytearray, conn: ChainConnection | None = None,
                may_resend: bool = True) -> bytes:
        """The response side for ``frame`` (no size prefix); the reply's bytes (size prefix included), or b""
        when the chain asked to send the request again (``ex.resend``)."""
        ex.may_resend = may_resend
        self.chain.on_response(conn or self.conn, ex, frame)
        if ex.resend:
            return b""
        assert ex.reply is not None
        return b"".join(bytes(b) for b in ex.reply)
