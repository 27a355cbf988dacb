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

ShareFetch/ShareAcknowledge (KIP-932) responses carry broker endpoints in NodeEndpoints, and the specs
Sluice loads (kafka-python's copy of Kafka's) do not describe them yet, so Sluice cannot rewrite those
addresses: it withholds those APIs rather than let a client learn a real broker address.
"""

from __future__ import annotations

from .messages import API_VERSIONS_KEY, negotiable_versions, request_spec
from .model import Message

#: APIs whose responses carry broker addresses that Sluice's specs cannot rewrite (see module docstring).
WITHHELD_APIS = frozenset({78, 79})  # ShareFetch, ShareAcknowledge

UNSUPPORTED_VERSION = 35


def intersect(body: Message) -> Message:
    """Cap the broker's advertised version ranges to what Sluice decodes or relays; drop APIs left with none."""
    kept = []
    for entry in body.api_keys:
        if entry.api_key in WITHHELD_APIS:
            continue
        ours = negotiable_versions(entry.api_key)
        if ours is not None:
            lo, hi = max(entry.min_version, ours.low), min(entry.max_version, ours.high)
            if lo > hi:
                continue
            entry = entry.replace(min_version=lo, max_version=hi)
        kept.append(entry)
    return body.replace(api_keys=kept)


def unsupported_api_versions_body() -> Message:
    """Kafka's answer to an ApiVersions request version it does not know (ApiVersionsRequest
    .getErrorResponse): error UNSUPPORTED_VERSION and, so the client can retry, the ApiVersions range the
    server does support. Always written at version 0 (with response header v0)."""
    valid = request_spec(API_VERSIONS_KEY).valid
    return Message(
        error_code=UNSUPPORTED_VERSION,
        api_keys=[Message(api_key=API_VERSIONS_KEY, min_version=valid.low, max_version=valid.high)],
    )
