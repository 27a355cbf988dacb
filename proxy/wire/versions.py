"""ApiVersions: what Sluice lets clients negotiate.

A client picks, per API, the highest version both it and the broker support, from the ranges in the
ApiVersions response. Where Sluice decodes an API, the broker's range is capped to the versions Sluice's
codecs read, so a client never speaks a version Sluice cannot parse — grepplabs/kafka-proxy's users hit
"unsupported schema version" for years because it relayed ranges as-is; Kroxylicious intersects them like
this. Only the side where decoding could fail is capped: versions the proxy relays as bytes are not
(proxy/codecs/manifest.json "versions" plus "relayed", :func:`~proxy.wire.messages.negotiable_versions`). That
matters for Produce: Kafka 4.x advertises it from v0 although only v3+ exist (KAFKA-18659,
ProduceRequest.json), because librdkafka before 2.11.1 turns compression off when Produce v0 is missing;
Sluice relays Produce v0-9 as bytes, so the broker's min reaches clients unchanged. APIs the manifest does
not list (never decoded) pass through untouched.

An API whose broker range and Sluice's do not overlap is withheld from clients (left out of the response): they then
never send it. :func:`intersect` says which, so the proxy can log and count it (a client that finds an API
missing says so, if at all, only at DEBUG: a share consumer with no ShareFetch spun at a full core receiving
nothing). ShareFetch/ShareAcknowledge (KIP-932), once withheld for want of a spec, are decoded now
(proxy/wire/kio_specs.py) and their NodeEndpoints rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .api_keys import ApiKey
from .messages import negotiable_versions, request_spec
from .model import Message
from .schema import Versions

UNSUPPORTED_VERSION = 35


def offered(api_key: int, read: Mapping[int, Versions] = MappingProxyType({})) -> Versions | None:
    """The versions of ``api_key`` clients may use through Sluice: what it decodes or relays, and of those, for an
    API its policies declare, only the versions they all read (``read``; proxy/core/policy.py). None: not capped."""
    ours = negotiable_versions(api_key)
    policies = read.get(api_key)
    if policies is None:
        return ours
    if ours is None:
        return policies
    return Versions(max(ours.low, policies.low), min(ours.high, policies.high))


def intersect(body: Message, read: Mapping[int, Versions] = MappingProxyType({})) -> tuple[Message,
                                                                                          list[tuple[int, int, int]]]:
    """Cap the broker's advertised version ranges to what Sluice :func:`offered`; drop APIs left with none.
    Returns the new body and the APIs dropped, as (api key, broker's min, broker's max)."""
    kept = []
    withheld = []
    for entry in body.api_keys:
        ours = offered(entry.api_key, read)
        if ours is not None:
            lo, hi = max(entry.min_version, ours.low), min(entry.max_version, ours.high)
            if lo > hi:
                withheld.append((entry.api_key, entry.min_version, entry.max_version))
                continue
            entry = entry.replace(min_version=lo, max_version=hi)
        kept.append(entry)
    return body.replace(api_keys=kept), withheld


def unsupported_api_versions_body() -> Message:
    """Kafka's answer to an ApiVersions request version it does not know (ApiVersionsRequest
    .getErrorResponse): error UNSUPPORTED_VERSION and, so the client can retry, the ApiVersions range the
    server does support. Always written at version 0 (with response header v0)."""
    valid = request_spec(ApiKey.API_VERSIONS).valid
    return Message(
        error_code=UNSUPPORTED_VERSION,
        api_keys=[Message(api_key=ApiKey.API_VERSIONS, min_version=valid.low, max_version=valid.high)],
    )
