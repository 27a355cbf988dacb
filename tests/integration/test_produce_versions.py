"""Produce v0-2 through Sluice, against the real broker.

A Kafka 4.x broker advertises Produce from v0 (KAFKA-18659, ProduceRequest.json) but refuses v0-2 by closing
the connection. Sluice passes the advertised range on, so a client may send them: Sluice must relay the
request (not reject it itself) and the broker's answer, reading Acks where v0-2 keep it (first), so that it
waits for the broker unless acks=0.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from tests.support.legacy_produce import produce_v0_2_frame

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap) as p:
        yield p


def rejected(sluice: ProxyThread, reason: str) -> float:
    return sluice.total("sluice_frames_rejected_total", reason=reason)


def answer(port: int, frame: bytes) -> bytes:
    """Send one request on a fresh connection; everything received until the other side closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_v0_2_relayed_to_the_broker(sluice: ProxyThread, kafka_broker: KafkaBroker, version: int,
                                            acks: int) -> None:
    frame = produce_v0_2_frame(version, acks, topic="legacy-produce")
    assert answer(kafka_broker.port, frame) == b""  # the broker's own answer: the connection closed
    before = {reason: rejected(sluice, reason) for reason in ("unsupported_version", "malformed", "upstream_closed")}
    assert answer(sluice.proxy.bootstrap_port, frame) == b""  # the same through Sluice
    after = {reason: rejected(sluice, reason) for reason in before}
    # Sluice did not refuse the request itself; the broker closed while Sluice awaited its response, which
    # it does only when the request's acks are not 0 (with acks=0 Kafka sends no response).
    assert after == {**before, "upstream_closed": before["upstream_closed"] + (acks != 0)}
