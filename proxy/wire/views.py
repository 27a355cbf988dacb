"""Decoded views of request and response frames, as the policy chain hands them to policies: each frame is
decoded once (whatever number of policies read it), edited in place, and encoded at most once, only if a policy
changed it.

The representation depends on the API, because the cost does:

- Fetch requests: :class:`~proxy.wire.fetch_request_fast.FetchEdit` (the request fast path);
- Fetch responses: :class:`FetchResponse` over :class:`~proxy.wire.fetch_fast.FetchResponseView` (zero-copy:
  record bytes stay slices of the received frame and go out as scatter buffers);
- Metadata responses: :class:`MetadataHead`, only the head up to Brokers (the only addresses) is decoded; the
  topics, most of a large cluster's response, stay bytes;
- every other API: :class:`MessageRequest` / :class:`MessageResponse`, decoded with the construct codec the
  first time a policy asks for the body.

A frame here is what follows the 4-byte size prefix (header + body), as in :mod:`proxy.wire.messages`.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from functools import cache, partial

from . import fetch_fast
from .api_keys import ApiKey
from .compiler import head_codec
from .errors import CodecError, MalformedFrame
from .fetch_fast import FetchResponseView
from .fetch_request_fast import FetchEdit, decode_fetch_request
from .messages import (
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    header_v1_body_offset,
    response_body_offset,
    response_header_version,
    response_spec,
)
from .model import Message
from .skim import shape_memo, top_level_tags_empty
from .versions import UNSUPPORTED_VERSION

_I16 = struct.Struct(">h")

Buffer = bytes | bytearray | memoryview


def _framed(body: Buffer) -> tuple[list[Buffer], int]:
    return [len(body).to_bytes(4, "big"), body], len(body) + 4


# ------------------------------------------------------------------------------------------------ requests


class MessageRequest:
    """A request decoded lazily with the construct codec (``header``, ``body`` on first access)."""

    __slots__ = ("_body", "_header", "changed", "frame")

    def __init__(self, frame: bytes) -> None:
        self.frame = frame
        self._header: Message | None = None
        self._body: Message | None = None
        self.changed = False

    def _decode(self) -> None:
        try:
            self._header, self._body = decode_request(self.frame)
        except CodecError as e:
            raise MalformedFrame(e.what, where=e.where, api=e.api, version=e.version) from None

    @property
    def header(self) -> Message:
        if self._header is None:
            self._decode()
        assert self._header is not None
        return self._header

    @property
    def body(self) -> Message:
        if self._body is None:
            self._decode()
        assert self._body is not None
        return self._body

    @body.setter
    def body(self, body: Message) -> None:
        self.header  # noqa: B018  (decode the header before replacing the body)
        self._body = body
        self.changed = True

    def replace_frame(self, frame: bytes) -> None:
        """Send ``frame`` instead (see :meth:`FetchEdit.replace_frame`)."""
        self.frame = frame
        self._header = self._body = None
        self.changed = True

    def encode(self) -> bytes:
        if self._body is None:
            return self.frame
        return encode_request(self.header, self.body)


RequestView = FetchEdit | MessageRequest


def request_view(api_key: int, frame: bytes, header: RequestHeader | None = None) -> RequestView:
    """The view policies edit for a request of ``api_key`` (frame without size prefix; ``header``: its header as
    read already, if it was). A malformed frame raises :class:`MalformedFrame`, here or when its body is first
    read."""
    if api_key == ApiKey.FETCH:
        try:
            return FetchEdit(decode_fetch_request(frame, header))
        except CodecError as e:
            raise MalformedFrame(e.what, where=e.where, api=e.api, version=e.version) from None
    return MessageRequest(frame)


# ----------------------------------------------------------------------------------------------- responses


class MessageResponse:
    """A response decoded lazily with the construct codec. ApiVersions: a server that does not support the
    request's ApiVersions version answers in v0, and clients check the error code before choosing the layout
    (ApiVersionsResponse.parse, KIP-511), so such an answer is read (and written) as v0."""

    __slots__ = ("_body", "_header", "api_key", "changed", "frame", "version")

    def __init__(self, api_key: int, version: int, frame: Buffer) -> None:
        if (api_key == ApiKey.API_VERSIONS and len(frame) >= 6
                and _I16.unpack_from(frame, 4)[0] == UNSUPPORTED_VERSION):
            version = 0
        self.api_key = api_key
        self.version = version
        self.frame = frame
        self._header: Message | None = None
        self._body: Message | None = None
        self.changed = False

    @property
    def decoded(self) -> bool:
        return self._body is not None

    @property
    def body(self) -> Message:
        """The body (decoded on first access). Policies edit it in place and set :attr:`changed`."""
        if self._body is None:
            self._header, self._body = decode_response(self.api_key, self.version, self.frame)
        return self._body

    def top_level_tags_empty(self) -> bool:
        """For a flexible version: whether the body's top-level tag section is empty (:func:`tags_empty`)."""
        return tags_empty(self.api_key, self.version)(memoryview(self.frame))

    def error_codes(self) -> list[int]:
        return error_codes(self._body) if self._body is not None else []

    def replace_body(self, body: bytes) -> None:
        """Make the response ``body`` (encoded, of this version), its header kept: for a policy that knows the
        encoded answer already. The response reads as undecoded again; a later :attr:`body` decodes the new one."""
        start = response_body_offset(self.api_key, self.version, self.frame)
        self.frame = bytes(self.frame[:start]) + body
        self._header = self._body = None
        self.changed = False

    def encode(self) -> tuple[list[Buffer], int]:
        if not self.changed or self._body is None:
            return _framed(self.frame)
        assert self._header is not None
        return _framed(encode_response(self.api_key, self.version, self._header, self._body))


class MetadataHead:
    """A Metadata response with only its head decoded, up to Brokers (the broker list comes first in every
    version, before the topics, which can be most of a large cluster's response: 10,000 partitions are
    ~260 KB and ~190 ms to decode and re-encode whole). The rest is relayed as bytes."""

    __slots__ = ("_rest", "_start", "changed", "frame", "head", "version")

    def __init__(self, version: int, frame: Buffer) -> None:
        view = memoryview(frame)
        self.frame = frame
        self.version = version
        self._start = response_body_offset(ApiKey.METADATA, version, view)
        stream = io.BytesIO(view[self._start :])
        self.head: Message = head_codec(response_spec(ApiKey.METADATA), version, "brokers").decode_from(stream)
        self._rest = view[self._start + stream.tell() :]
        self.changed = False

    @property
    def body(self) -> Message:
        return self.head

    def error_codes(self) -> list[int]:
        return []

    def encode(self) -> tuple[list[Buffer], int]:
        if not self.changed:
            return _framed(self.frame)
        new_head = head_codec(response_spec(ApiKey.METADATA), self.version, "brokers").encode(self.head)
        view = memoryview(self.frame)
        size = self._start + len(new_head) + len(self._rest)
        return [size.to_bytes(4, "big"), view[: self._start], new_head, self._rest], size + 4


class FetchResponse:
    """A Fetch response as :class:`FetchResponseView` (zero-copy). Policies may edit :attr:`view` in place or
    replace it with one they built (fetch sessions do), setting :attr:`changed`."""

    __slots__ = ("_corr", "_header_tags", "changed", "frame", "view")

    def __init__(self, version: int, frame: Buffer) -> None:
        self.frame = frame
        self._corr, self._header_tags, self.view = fetch_fast.decode_frame(memoryview(frame), version)
        self.changed = False

    def error_codes(self) -> list[int]:
        return self.view.error_codes()

    def encode(self) -> tuple[list[Buffer], int]:
        if not self.changed:
            return _framed(self.frame)
        return self.view.encode_frame(self._corr, self._header_tags)


ResponseView = FetchResponse | MetadataHead | MessageResponse


def response_view(api_key: int, version: int, frame: Buffer) -> ResponseView:
    """The view policies edit for a response of (``api_key``, ``version``) (frame without size prefix)."""
    if api_key == ApiKey.FETCH:
        return FetchResponse(version, frame)
    if api_key == ApiKey.METADATA:
        return MetadataHead(version, frame)
    return MessageResponse(api_key, version, frame)


@cache
def tags_empty(api_key: int, version: int) -> Callable[[Buffer], bool]:
    """For a flexible response version: a function (frame without size prefix) -> whether the body's top-level
    tag section is empty, found by skimming the fields without decoding them, and answered from the shapes seen
    before when it can (proxy/wire/skim.py). CodecError if the frame is malformed."""
    if response_header_version(api_key, version) == 0:
        return shape_memo(top_level_tags_empty(response_spec(api_key), version, None))
    return shape_memo(top_level_tags_empty(response_spec(api_key), version,
                                           partial(header_v1_body_offset, api_key, version)))


def error_codes(msg: Message) -> list[int]:
    """Every non-zero error code in a decoded message (for the access log)."""
    out: list[int] = []

    def walk(m: Message) -> None:
        for k, v in m.fields().items():
            if k == "error_code" and v:
                out.append(v)
            elif isinstance(v, Message):
                walk(v)
            elif isinstance(v, list) and v and isinstance(v[0], Message):
                for x in v:
                    walk(x)

    walk(msg)
    return out


def local_response(api_key: int, version: int, correlation_id: int, body: Message) -> bytes:
    """A whole response frame Sluice answers itself (size prefix included)."""
    frame = encode_response(api_key, version, Message(correlation_id=correlation_id), body)
    return len(frame).to_bytes(4, "big") + frame


__all__ = ["FetchResponse", "FetchResponseView", "MessageRequest", "MessageResponse", "MetadataHead",
           "RequestView", "ResponseView", "error_codes", "local_response", "request_view", "response_view"]
