"""What the proxy reads of a Produce request without decoding it: its ``Acks``.

A Produce request with acks=0 gets no response (ProduceRequest.json: "0 for no acknowledgments"), so the proxy
must not wait for one.
"""

from __future__ import annotations

import io
import struct

from .compiler import read_uvarint
from .errors import CodecError
from .messages import RequestHeader

_I16 = struct.Struct(">h")


def produce_acks(frame: bytes | bytearray | memoryview, header: RequestHeader) -> int:
    """ProduceRequest v3+: TransactionalId (nullable string, compact from v9) then Acks (int16)."""
    assert header.body_offset is not None
    stream = io.BytesIO(frame)
    stream.seek(header.body_offset)
    if header.api_version >= 9:
        n = read_uvarint(stream) - 1
    else:
        raw = stream.read(2)
        if len(raw) != 2:
            raise CodecError("truncated ProduceRequest", api="Produce", version=header.api_version)
        n = _I16.unpack(raw)[0]
    if n > 0:
        stream.seek(n, io.SEEK_CUR)
    raw = stream.read(2)
    if len(raw) != 2:
        raise CodecError("truncated ProduceRequest", api="Produce", version=header.api_version)
    return int(_I16.unpack(raw)[0])
