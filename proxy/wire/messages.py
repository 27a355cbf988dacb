"""Kafka request/response frames: the API registry, headers, and decode/encode of whole frames.

A *frame* here is what follows the 4-byte size prefix on the wire: header + body. Header versions follow
Kafka's ApiMessageType.requestHeaderVersion/responseHeaderVersion: request header v2 and response header v1
for flexible API versions, v1/v0 otherwise — except ApiVersions responses, which always use header v0 so a
client can read them before it knows what the broker supports (KIP-511).
"""

from __future__ import annotations

import io
import struct
from functools import cache, lru_cache
from typing import Any, NamedTuple, cast

from .api_keys import ApiKey, api_names
from .api_keys import api_name as api_name  # re-exported: the frame helpers' callers name APIs too
from .api_keys import known_api as known_api
from .compiler import Codec, compiled_for, skip_tags
from .errors import CodecError
from .model import Message
from .schema import NONE, MessageSpec, Versions, kafka_spec, manifest, valid_versions

_HDR = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_HDR_SIZE = _HDR.size
_CORR = struct.Struct(">i")


@cache
def request_spec(api_key: int) -> MessageSpec:
    if api_key not in api_names():
        raise CodecError(f"unknown api key {api_key}", api=api_key)
    return kafka_spec(api_names()[api_key] + "Request")


@cache
def response_spec(api_key: int) -> MessageSpec:
    if api_key not in api_names():
        raise CodecError(f"unknown api key {api_key}", api=api_key)
    return kafka_spec(api_names()[api_key] + "Response")


def request_codec(api_key: int, version: int) -> Codec:
    return compiled_for(request_spec(api_key), version)


def response_codec(api_key: int, version: int) -> Codec:
    return compiled_for(response_spec(api_key), version)


def _manifest_entry(api_key: int) -> dict[str, Any] | None:
    entry = manifest()["apis"].get(api_name(api_key))
    return None if entry is None else cast(dict[str, Any], entry)


@cache
def decoded_versions(api_key: int) -> Versions | None:
    """The versions of ``api_key`` Sluice's codecs decode (proxy/codecs/manifest.json "versions"), or None if the
    manifest does not list it."""
    entry = _manifest_entry(api_key)
    if entry is None:
        return None
    if api_key not in api_names():
        raise CodecError(f"unknown api key {api_key}", api=api_key)
    valid = valid_versions(api_names()[api_key] + "Request")  # the range only: the spec is built on first decode
    if entry["versions"] == "all":
        return valid
    wanted = Versions.parse(entry["versions"])
    return Versions(max(valid.low, wanted.low), min(valid.high, wanted.high))


@cache
def relayed_versions(api_key: int) -> Versions:
    """The versions of ``api_key`` the proxy relays as bytes, never decoding them (proxy/codecs/manifest.json
    "relayed"; empty when absent): whatever their layout, Sluice can carry them."""
    entry = _manifest_entry(api_key)
    return NONE if entry is None else Versions.parse(entry.get("relayed"))


@cache
def negotiable_versions(api_key: int) -> Versions | None:
    """The versions of ``api_key`` a client may negotiate through Sluice: those it decodes plus those it
    relays as bytes. A broker's ApiVersions range is capped to this (proxy/wire/versions.py); None: not capped
    (the manifest does not list the API, so the proxy never decodes it)."""
    decoded = decoded_versions(api_key)
    if decoded is None:
        return None
    relayed = relayed_versions(api_key)
    if relayed.empty:
        return decoded
    if relayed.low > decoded.high + 1 or decoded.low > relayed.high + 1:
        # a gap would be a version the client may pick that Sluice can neither decode nor relay
        raise CodecError(f"proxy/codecs/manifest.json: relayed {relayed.low}-{relayed.high} and decoded "
                         f"{decoded.low}-{decoded.high} versions must form one range", api=api_key)
    return Versions(min(decoded.low, relayed.low), max(decoded.high, relayed.high))


def request_header_version(api_key: int, api_version: int) -> int:
    return 2 if api_version in request_spec(api_key).flexible else 1


@lru_cache(maxsize=4096)  # every response Sluice reads or skims: one look-up (bounded: versions come from clients)
def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if api_version in response_spec(api_key).flexible else 0


@cache
def header_codec(kind: str, version: int) -> Codec:
    return compiled_for(kafka_spec(kind), version)


# --------------------------------------------------------------------------------------------- requests


class RequestHeader(NamedTuple):
    """What the proxy reads from every request without decoding its body (cheap: one struct unpack). A named
    tuple: made on every request, in one C call (:data:`_header`), its fields read by C descriptors."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: offset of the body in the frame, or None when the API or version is unknown (its header version is
    #: then unknown)
    body_offset: int | None


#: a RequestHeader from a tuple of its fields, without the Python-level ``__new__`` a named tuple's call runs
_header = tuple.__new__

#: api key -> the request header version of each of its versions, index = version (0..the spec's newest), filled
#: on an API's first request; bounded: only keys Kafka defines get an entry
_HEADER_VERSIONS: dict[int, tuple[int, ...]] = {}


def _header_versions(api_key: int) -> tuple[int, ...]:
    """The request header version (1 or 2) of each version of ``api_key`` up to its spec's newest; () for a key
    Kafka does not define. Versions below the spec's valid range are located too: Kafka 4.0 dropped old versions
    from its specs (KIP-896) yet still advertises Produce v0-2 (KAFKA-18659, ProduceRequest.json), which Sluice
    relays and peeks at (wire/produce.py). Their header version is still known: flexibleVersions is always "N+",
    so a removed version is older than any flexible one and uses header v1."""
    versions = _HEADER_VERSIONS.get(api_key)
    if versions is None:
        if api_key not in api_names():
            return ()
        versions = _HEADER_VERSIONS[api_key] = tuple(
            request_header_version(api_key, v) for v in range(request_spec(api_key).valid.high + 1))
    return versions


def peek_request_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """Read the request header's fixed part (identical in header v1 and v2) and locate the body. The per-request
    cost of every request Sluice serves: one unpack, one table look-up, the client id decoded."""
    if len(frame) < _HDR_SIZE:
        raise CodecError(f"request frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, corr, n = _HDR.unpack_from(frame, 0)
    pos = _HDR_SIZE
    client_id: str | None = None
    if n >= 0:
        if pos + n > len(frame):
            raise CodecError(f"client id length {n} exceeds the frame", where=pos, api=api_key, version=api_version)
        try:
            # bytes' decode is a method call; str(..., "utf-8") a type call parsing its arguments (a memoryview
            # has no decode)
            client_id = frame[pos : pos + n].decode() if type(frame) is bytes else str(frame[pos : pos + n], "utf-8")
        except UnicodeDecodeError:
            raise CodecError("client id is not UTF-8", where=pos, api=api_key, version=api_version) from None
        pos += n
    elif n != -1:
        raise CodecError(f"client id length {n}", where=pos - 2, api=api_key, version=api_version)
    versions = _HEADER_VERSIONS.get(api_key) or _header_versions(api_key)
    if not 0 <= api_version < len(versions):
        return _header(RequestHeader, (api_key, api_version, corr, client_id, None))
    if versions[api_version] == 2:
        # request header v2 ends with a tag section (KIP-482); nearly always empty: one zero byte
        if pos < len(frame) and frame[pos] == 0:
            pos += 1
        else:
            try:
                pos = skip_tags(memoryview(frame), pos)
            except IndexError:
                raise CodecError("truncated request header tags", api=api_key, version=api_version) from None
            if pos > len(frame):
                raise CodecError("request header tags exceed the frame", api=api_key, version=api_version)
    return _header(RequestHeader, (api_key, api_version, corr, client_id, pos))


def decode_request(frame: bytes | bytearray | memoryview) -> tuple[Message, Message]:
    """Decode a whole request frame into (header, body)."""
    peek = peek_request_header(frame)
    if peek.api_key not in api_names():
        raise CodecError(f"unknown api key {peek.api_key}", api=peek.api_key, version=peek.api_version)
    stream = io.BytesIO(frame)
    header = header_codec("RequestHeader", request_header_version(peek.api_key, peek.api_version)).decode_from(
        stream
    )
    codec = request_codec(peek.api_key, peek.api_version)
    body = codec.decode_from(stream)
    if stream.tell() != len(frame):
        raise CodecError(f"{len(frame) - stream.tell()} trailing bytes", api=codec.spec.name, version=codec.version)
    return header, body


def encode_request(header: Message, body: Message) -> bytes:
    """Encode (header, body); the API and version come from the header."""
    api_key, version = header.request_api_key, header.request_api_version
    stream = io.BytesIO()
    header_codec("RequestHeader", request_header_version(api_key, version)).encode_into(header, stream)
    request_codec(api_key, version).encode_into(body, stream)
    return stream.getvalue()


# --------------------------------------------------------------------------------------------- responses


def response_correlation_id(frame: bytes | bytearray | memoryview) -> int:
    if len(frame) < 4:
        raise CodecError(f"response frame of {len(frame)} bytes has no correlation id")
    return int(_CORR.unpack_from(frame, 0)[0])


def response_body_offset(api_key: int, api_version: int, frame: bytes | bytearray | memoryview) -> int:
    """Where the body starts: after the correlation id, and the tag section for header v1."""
    if response_header_version(api_key, api_version) == 0:
        return 4
    return header_v1_body_offset(api_key, api_version, frame)


def header_v1_body_offset(api_key: int, api_version: int, frame: bytes | bytearray | memoryview) -> int:
    """Where the body of a response with header v1 starts: after the correlation id and the header's tag section
    (for a caller that knows the header version already: the skim of every Produce v10+ response)."""
    if len(frame) > 4 and frame[4] == 0:
        return 5  # the header's tag section is nearly always empty: one zero byte, read in place
    try:
        pos = skip_tags(memoryview(frame), 4)
    except IndexError:
        raise CodecError("truncated response header", api=api_key, version=api_version) from None
    if pos > len(frame):
        raise CodecError("response header tags exceed the frame", api=api_key, version=api_version)
    return pos


def decode_response(api_key: int, api_version: int, frame: bytes | bytearray | memoryview) -> tuple[Message, Message]:
    stream = io.BytesIO(frame)
    header = header_codec("ResponseHeader", response_header_version(api_key, api_version)).decode_from(stream)
    codec = response_codec(api_key, api_version)
    body = codec.decode_from(stream)
    if stream.tell() != len(frame):
        raise CodecError(f"{len(frame) - stream.tell()} trailing bytes", api=codec.spec.name, version=codec.version)
    return header, body


def encode_response(api_key: int, api_version: int, header: Message, body: Message) -> bytes:
    stream = io.BytesIO()
    header_codec("ResponseHeader", response_header_version(api_key, api_version)).encode_into(header, stream)
    response_codec(api_key, api_version).encode_into(body, stream)
    return stream.getvalue()


# --------------------------------------------------------------------------------------------- consumer protocol

_CONSUMER_PROTOCOL = {"subscription": "ConsumerProtocolSubscription", "assignment": "ConsumerProtocolAssignment"}


def decode_consumer_protocol(kind: str, data: bytes | bytearray | memoryview) -> tuple[int, Message]:
    """The "consumer" protocol payload of JoinGroup metadata ("subscription") or SyncGroup assignments
    ("assignment"): an int16 version, then the struct. Like Kafka's ConsumerProtocol, a version newer than the
    spec knows is read with the newest known layout (newer versions only append fields), and bytes after the
    known fields are tolerated for the same reason. Returns (version as written, struct)."""
    spec = kafka_spec(_CONSUMER_PROTOCOL[kind])
    if len(data) < 2:
        raise CodecError(f"consumer protocol {kind} of {len(data)} bytes has no version", api=spec.name)
    version = int.from_bytes(data[:2], "big", signed=True)
    if version < spec.valid.low:
        raise CodecError(f"consumer protocol {kind} version {version}", api=spec.name, version=version)
    codec = compiled_for(spec, min(version, spec.valid.high))
    return version, codec.decode(memoryview(data)[2:], exact=version <= spec.valid.high)


def encode_consumer_protocol(kind: str, version: int, msg: Message) -> bytes:
    spec = kafka_spec(_CONSUMER_PROTOCOL[kind])
    return version.to_bytes(2, "big", signed=True) + compiled_for(spec, min(version, spec.valid.high)).encode(msg)
