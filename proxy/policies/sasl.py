"""SASL relayed untouched, and seen: the authenticated principal's name becomes the connection's
(``ConnectionInfo.principal``: a client selector for size limits, throttles and sharing, and ``principal`` in
the access log).

Sluice never answers, changes or stores a SASL message: the client authenticates with the broker through it
(KIP-43 SaslHandshake v1, then SaslAuthenticate rounds, KIP-152), and again on the open connection when the
broker's session expires (KIP-368 re-authentication: the same two requests). From the first SaslAuthenticate
request of each exchange :mod:`proxy.core.sasl_principal` keeps the name and nothing else (the bytes are not
kept, logged or counted by content); the name is adopted once the broker answers that the exchange succeeded.

SaslHandshake v0 (before KIP-152) is followed too: after a successful v0 handshake the tokens travel in bare
frames, a length and the token without a Kafka header, each answered by one such frame. Kafka 4.1 still accepts
v0, and kafka-python <= 2.0.2, Sarama <= 1.40.1 (by default) and aiokafka <= 0.12 (api_version="auto") still
send it. The policy asks the core to relay bare frames (``Exchange.bare_tokens``) and follows the exchange through
them, for the mechanisms whose end it can tell (PLAIN, SCRAM, OAUTHBEARER: the same rules as above, on the bare
answers); for any other (GSSAPI) a v0 handshake is answered UNSUPPORTED_VERSION, the error a broker gives for a
version it does not serve, with one log event: Sluice could not tell where the tokens end and Kafka requests
begin again, and would then relay requests it never read. Clients that read ApiVersions use v1.
"""

from __future__ import annotations

from typing import Any

from ..accesslog import get_logger
from ..core.exchange import ConnectionInfo, Exchange
from ..core.policy import Policy, Services, reads
from ..core.sasl_principal import MECHANISMS, SaslExchange
from ..wire.api_keys import ApiKey
from ..wire.model import Message
from ..wire.versions import UNSUPPORTED_VERSION
from ..wire.views import MessageRequest, MessageResponse, ResponseView, local_response

log = get_logger("sluice.sasl")


class _State:
    """One connection's SASL exchanges; also the core's :class:`~proxy.core.exchange.BareTokens` after a v0
    handshake."""

    __slots__ = ("exchange", "info", "metrics")

    def __init__(self, info: ConnectionInfo, metrics: Any) -> None:
        self.info = info
        self.metrics = metrics
        self.exchange = SaslExchange()

    def answered(self, error_code: int, auth_bytes: bytes) -> bool:
        """A server answer; when it completes a successful exchange, the principal becomes the connection's."""
        if not self.exchange.response(error_code, auth_bytes):
            return False
        self.metrics.sasl_authentications.inc()
        info = self.info
        if info.principal != self.exchange.principal:
            info.principal = self.exchange.principal
            log.info("sasl_authenticated", conn=info.conn_id, listener=info.listener, principal=info.principal,
                     client=info.client_host)
        return True

    # BareTokens (SaslHandshake v0): a bare answer carries no error code; a failure closes the connection
    def client_token(self, token: bytes) -> None:
        self.exchange.request(token)

    def server_token(self, token: bytes) -> bool:
        return self.answered(0, token)


class Sasl(Policy):
    name = "sasl"
    def __init__(self, services: Services) -> None:
        self.apis = reads(ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
        self.metrics = services.metrics

    def open(self, info: ConnectionInfo) -> _State:
        return _State(info, self.metrics)

    def on_request(self, ex: Exchange, conn: _State) -> Any:
        request = ex.request
        assert isinstance(request, MessageRequest)
        if ex.header.api_key == ApiKey.SASL_HANDSHAKE:
            mechanism = (request.body.mechanism or "").upper()
            if ex.header.api_version == 0 and mechanism not in MECHANISMS:
                info = conn.info
                log.warning("sasl_handshake_v0_refused", conn=info.conn_id, listener=info.listener,
                            client=info.client_host, client_id=ex.client_id, mechanism=mechanism[:40])
                ex.answer = local_response(ApiKey.SASL_HANDSHAKE, 0, ex.header.correlation_id,
                                           Message(error_code=UNSUPPORTED_VERSION, mechanisms=[]))
                return None
            conn.exchange.handshake(mechanism)
            if ex.header.api_version == 0:
                ex.collect = True  # a successful v0 handshake switches the connection to bare tokens
                return True
            return None
        conn.exchange.request(bytes(request.body.auth_bytes or b""))
        ex.collect = True  # the error code and the server's bytes say whether the exchange succeeded
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: _State, state: Any) -> None:
        assert isinstance(response, MessageResponse)
        body = response.body
        if ex.header.api_key == ApiKey.SASL_HANDSHAKE:
            if body.error_code == 0:
                ex.bare_tokens = conn
            return
        conn.answered(body.error_code, bytes(body.auth_bytes or b""))
