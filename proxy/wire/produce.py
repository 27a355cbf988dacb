"""Produce requests: the one field the proxy reads from them.

Sluice relays Produce requests as bytes. It only needs Acks: with acks=0 Kafka sends no response at all
(ProduceRequest.json, "0 for no acknowledgments"), so the proxy must not wait for one. Acks comes after at
most one variable-length field, so it is peeked at without decoding the body (whose records can be megabytes).

The layouts (ProduceRequest.json and, for v0-2, the Kafka 3.x spec they were removed from by KIP-896):

- v0-2: Acks is the first field of the body; TransactionalId does not exist yet.
- v3-8: TransactionalId (nullable string: int16 length, -1 = null), then Acks.
- v9+ (flexible, KIP-482): TransactionalId (nullable compact string: unsigned varint length + 1, 0 = null),
  then Acks.

v0-2 are no longer in the spec, and a Kafka 4.x broker refuses them, yet it advertises Produce from v0 on
purpose (KAFKA-18659: librdkafka before 2.11.1 turns compression off when Produce v0 is missing). Sluice passes
that range on (proxy/wire/versions.py), so a client may send them: Sluice must relay them with their acks read
right, and the broker's answer (it closes the connection) reaches the client.
"""

from __future__ import annotations

import struct
from functools import cache

from .api_keys import ApiKey
from .compiler import uvarint_at
from .errors import MALFORMED, CodecError, as_codec_error
from .messages import RequestHeader, request_spec

#: ProduceRequest.json: TransactionalId "versions": "3+"
FIRST_TRANSACTIONAL_VERSION = 3

_I16 = struct.Struct(">h")


@cache
def _first_flexible() -> int:
    """ProduceRequest.json's first flexible version ("flexibleVersions": "9+": always N+, KIP-482)."""
    return request_spec(ApiKey.PRODUCE).flexible.low


def produce_acks(frame: bytes | bytearray | memoryview, header: RequestHeader) -> int:
    """The Acks of a Produce request frame (header + body, no size prefix) whose header is ``header``
    (from :func:`~proxy.wire.messages.peek_request_header`). Raises CodecError when the frame ends before
    Acks or the body was not located."""
    version = header.api_version
    pos = header.body_offset
    if pos is None:
        raise CodecError("Produce request body not located", api="Produce", version=version)
    try:
        if version >= FIRST_TRANSACTIONAL_VERSION:
            if version >= _first_flexible():
                n = frame[pos]  # compact: length + 1, 0 = null; one byte below 128 (an id under 127 bytes)
                if n < 0x80:
                    pos += 1
                else:
                    n, pos = uvarint_at(memoryview(frame), pos)
                n -= 1
            else:
                (n,) = _I16.unpack_from(frame, pos)
                pos += 2
            if n > 0:  # any negative length is null, as Kafka's readers take it
                pos += n
        acks: int = _I16.unpack_from(frame, pos)[0]
        return acks
    except MALFORMED as e:  # free until it fires: this runs on every producer's request
        raise as_codec_error(e, "ProduceRequest", api="Produce", version=version) from None
