"""A response's ``throttle_time_ms``, read and set where it lies, without decoding the response (KIP-219).

Client quotas answer an over-quota client with the time it should back off in the response's
``throttle_time_ms`` (KIP-13, KIP-219). Produce responses of the versions Sluice relays as bytes (v0-9) are never
decoded (proxy/wire/produce.py), and a Fetch response is read through the zero-copy view, so the field is found
by its position (ProduceResponse.json, FetchResponse.json):

- Fetch v1+, ShareFetch and ShareAcknowledge (KIP-932, every version): the body's first field.
- Produce v1-8: the body's last field (after the responses).
- Produce v9+ (flexible): the last field before the body's top-level tag section (KIP-951's NodeEndpoints in
  v10+ are tagged), found by skipping the fields (:func:`~proxy.wire.skim.top_level_tags_locator`).

A response whose body was decoded gets the field set in the decoded body too, so a re-encoding carries it.
"""

from __future__ import annotations

import struct

from .api_keys import ApiKey
from .errors import CodecError
from .messages import response_body_offset, response_spec
from .skim import top_level_tags_locator
from .views import FetchResponse, MessageResponse, ResponseView

_I32 = struct.Struct(">i")
#: the APIs whose responses carry throttle_time_ms as the body's first field
_FIRST_FIELD = frozenset({ApiKey.FETCH, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE})


def _offset(api_key: int, version: int, frame: bytes | bytearray | memoryview) -> int:
    view = memoryview(frame)
    if api_key in _FIRST_FIELD:
        return response_body_offset(api_key, version, view)
    if version in response_spec(ApiKey.PRODUCE).flexible:
        locate = top_level_tags_locator(response_spec(ApiKey.PRODUCE), version)
        return locate(view, response_body_offset(ApiKey.PRODUCE, version, view)) - 4
    return len(frame) - 4


def carries_throttle_time(api_key: int, version: int) -> bool:
    """Whether the response of (``api_key``, ``version``) has ``throttle_time_ms`` (Produce and Fetch: v1+;
    ShareFetch, ShareAcknowledge: every version)."""
    if api_key in (ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE):
        return True
    return api_key in (ApiKey.PRODUCE, ApiKey.FETCH) and version >= 1


def throttle_time_ms(api_key: int, version: int, response: ResponseView) -> int:
    """The ``throttle_time_ms`` the broker put in a response that carries one (:func:`carries_throttle_time`)."""
    if isinstance(response, FetchResponse):
        return response.view.throttle_time_ms
    if isinstance(response, MessageResponse) and response.decoded:
        return int(response.body.throttle_time_ms)
    pos = _offset(api_key, version, response.frame)
    if pos < 0 or pos + 4 > len(response.frame):
        raise CodecError("throttle_time_ms lies outside the response", api=api_key, version=version)
    return int(_I32.unpack_from(response.frame, pos)[0])


def set_throttle_time_ms(api_key: int, version: int, response: ResponseView, ms: int) -> None:
    """Write ``ms`` as the response's ``throttle_time_ms``: in the decoded body or view, and in the frame's bytes
    unless a policy changed the response (then its re-encoding carries the field; else the frame goes out as it
    is, never re-encoded for this)."""
    if isinstance(response, FetchResponse):
        response.view.throttle_time_ms = ms  # carried by the view's encoding when a policy changed it
        if response.changed:
            return
    elif isinstance(response, MessageResponse) and response.decoded:
        response.body.throttle_time_ms = ms
        if response.changed:
            return
    frame = response.frame
    pos = _offset(api_key, version, frame)
    if pos < 0 or pos + 4 > len(frame):
        raise CodecError("throttle_time_ms lies outside the response", api=api_key, version=version)
    if not isinstance(frame, bytearray):
        frame = bytearray(frame)
        response.frame = frame
    _I32.pack_into(frame, pos, ms)


__all__ = ["carries_throttle_time", "set_throttle_time_ms", "throttle_time_ms"]
