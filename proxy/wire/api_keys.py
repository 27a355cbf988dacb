"""Kafka's API keys, named: the one table of names <-> keys, read from the specs.

Every *Request.json spec kafka-python ships carries its API's key ("apiKey"), and kio (generated from the same
JSON, proxy/wire/kio_specs.py) describes the APIs kafka-python does not ship yet: together they are every API
Kafka defines, as far as Sluice knows. Code names a key as ``ApiKey.FETCH`` (Kafka's own ApiKeys enum names);
the number comes from the spec, never from a literal written here.
"""

from __future__ import annotations

from functools import cache
from typing import Final

from .schema import kafka_python_specs, parse_spec_text


@cache
def api_names() -> dict[int, str]:
    """api key -> API name ("Fetch"), from every *Request.json spec kafka-python ships, and from kio for the keys
    kafka-python does not know yet: every API Kafka defines is a Kafka API to Sluice."""
    from .kio_specs import kio_api_names

    names: dict[int, str] = dict(kio_api_names())
    # Only each spec's "apiKey" is read here; the spec itself is built when its API is first decoded.
    for path in kafka_python_specs().glob("*Request.json"):
        key = parse_spec_text(path.read_text(encoding="utf-8")).get("apiKey")
        if key is not None:
            names[key] = path.name[: -len("Request.json")]
    return names


def api_name(api_key: int) -> str:
    """The API's name, or "Unknown(N)" for a key Kafka does not define (as far as Sluice knows)."""
    return api_names().get(api_key) or f"Unknown({api_key})"


def known_api(api_key: int) -> bool:
    """Whether Kafka defines the API key (a spec in kafka-python or kio describes it)."""
    return api_key in api_names()


def api_key(name: str) -> int:
    """The key of the API Kafka's specs call ``name`` ("Fetch"); KeyError if no spec does."""
    for key, spec_name in api_names().items():
        if spec_name == name:
            return key
    raise KeyError(f"no Kafka spec describes an API named {name!r}")


class ApiKey:
    """The API keys Sluice's code names, under Kafka's ApiKeys enum names; each value is read from the spec."""

    PRODUCE: Final = api_key("Produce")
    FETCH: Final = api_key("Fetch")
    LIST_OFFSETS: Final = api_key("ListOffsets")
    METADATA: Final = api_key("Metadata")
    OFFSET_COMMIT: Final = api_key("OffsetCommit")
    OFFSET_FETCH: Final = api_key("OffsetFetch")
    FIND_COORDINATOR: Final = api_key("FindCoordinator")
    JOIN_GROUP: Final = api_key("JoinGroup")
    HEARTBEAT: Final = api_key("Heartbeat")
    LEAVE_GROUP: Final = api_key("LeaveGroup")
    SYNC_GROUP: Final = api_key("SyncGroup")
    DESCRIBE_GROUPS: Final = api_key("DescribeGroups")
    SASL_HANDSHAKE: Final = api_key("SaslHandshake")
    API_VERSIONS: Final = api_key("ApiVersions")
    SASL_AUTHENTICATE: Final = api_key("SaslAuthenticate")
    DESCRIBE_CLUSTER: Final = api_key("DescribeCluster")
    CONSUMER_GROUP_HEARTBEAT: Final = api_key("ConsumerGroupHeartbeat")
    CONSUMER_GROUP_DESCRIBE: Final = api_key("ConsumerGroupDescribe")
    SHARE_FETCH: Final = api_key("ShareFetch")
    SHARE_ACKNOWLEDGE: Final = api_key("ShareAcknowledge")
