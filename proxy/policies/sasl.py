"""SASL relayed untouched, and seen: the authenticated principal's name becomes the connection's
(``ConnectionInfo.principal``: a client selector for size limits, throttles and sharing, and ``principal`` in
the access log).

Sluice never answers, changes or stores a SASL message: the client authenticates with the broker through it
(KIP-43 SaslHandshake v1, then SaslAuthenticate rounds, KIP-152), and again on the open connection when the
broker's session expires (KIP-368 re-authentication: the same two requests). From the first SaslAuthenticate
request of each exchange :mod:`proxy.core.sasl_principal` keeps the name and nothing else (the bytes are not
kept, logged or counted by content); the name is adopted once the broker answers that the exchange succeeded.

SaslHandshake v0 is refused: after a successful v0 handshake (before KIP-152) the tokens travel in bare frames
without a Kafka header, so a proxy that reads Kafka frames could neither follow them nor read a principal. Kafka
4.1 still advertises SaslHandshake 0-1; Sluice's ApiVersions offers 1 only (proxy/codecs/manifest.json), which
every client that reads ApiVersions then uses (the Java client since 1.0, librdkafka, kafka-python 3, current
Sarama and aiokafka). Clients that send v0 regardless (kafka-python <= 2.0.2, Sarama <= 1.40.1 by default, aiokafka
<= 0.12 with api_version="auto") get Sluice's answer UNSUPPORTED_VERSION (35), the error a broker gives for a
version it does not serve, and one log event; the request never reaches the broker.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..accesslog import get_logger
from ..core.exchange import ConnectionInfo, Exchange
from ..core.policy import Policy, Services
from ..core.sasl_principal import SaslExchange
from ..wire.model import Message
from ..wire.views import MessageRequest, MessageResponse, ResponseView, local_response

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
UNSUPPORTED_VERSION = 35

log = get_logger("sluice.sasl")


class _State:
    __slots__ = ("exchange", "info")

    def __init__(self, info: ConnectionInfo) -> None:
        self.info = info
        self.exchange = SaslExchange()


class Sasl(Policy):
    name = "sasl"
    apis: ClassVar[frozenset[int]] = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})

    def __init__(self, services: Services) -> None:
        self.metrics = services.metrics

    def open(self, info: ConnectionInfo) -> _State:
        return _State(info)

    def on_request(self, ex: Exchange, conn: _State) -> Any:
        request = ex.request
        assert isinstance(request, MessageRequest)
        if ex.header.api_key == SASL_HANDSHAKE:
            if ex.header.api_version == 0:
                info = conn.info
                log.warning("sasl_handshake_v0_refused", conn=info.conn_id, listener=info.listener,
                            client=info.client_host, client_id=ex.client_id)
                ex.answer = local_response(SASL_HANDSHAKE, 0, ex.header.correlation_id,
                                           Message(error_code=UNSUPPORTED_VERSION, mechanisms=[]))
                return None
            conn.exchange.handshake(request.body.mechanism or "")
            return None
        conn.exchange.request(bytes(request.body.auth_bytes or b""))
        ex.collect = True  # the error code and the server's bytes say whether the exchange succeeded
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: _State, state: Any) -> None:
        assert isinstance(response, MessageResponse)
        body = response.body
        info = conn.info
        if conn.exchange.response(body.error_code, bytes(body.auth_bytes or b"")):
            self.metrics.sasl_authentications.inc()
            if info.principal != conn.exchange.principal:
                info.principal = conn.exchange.principal
                log.info("sasl_authenticated", conn=info.conn_id, listener=info.listener, principal=info.principal,
                         client=info.client_host)
