"""Clients never learn a broker's real address: every response that carries one is rewritten to Sluice's
advertised host and the port of the node's listener (rules in :mod:`proxy.core.routing`).

Metadata (brokers), FindCoordinator (coordinators, batched or not), DescribeCluster (brokers), since KIP-951 the
NodeEndpoints tagged field of Fetch (v16+) and Produce (v10+) responses, and the NodeEndpoints of ShareFetch and
ShareAcknowledge responses (KIP-932, every version: a partition's new leader after NOT_LEADER_OR_FOLLOWER; measured
on Kafka 4.3 with them relayed, a share consumer connected to the broker's real address). A Fetch v16+ response streams
through with only its final tag section held back and rewritten (:mod:`proxy.wire.fetch_stream`) unless another
policy collects it whole; a Produce response's tag section is skimmed and the response relayed untouched when it
carries no endpoints (they appear only after a leadership change).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from ..core.exchange import Exchange, Rejected
from ..core.policy import Policy, Services
from ..wire.fetch_layout import FIRST_NODE_ENDPOINTS, MAX_VERSION
from ..wire.fetch_stream import FetchStreamer
from ..wire.messages import negotiable_versions
from ..wire.views import FetchResponse, MessageResponse, MetadataHead, ResponseView

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER = 0, 1, 3, 10, 60
SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79
#: the first Produce version with KIP-951 NodeEndpoints (ProduceResponse.json)
FIRST_PRODUCE_ENDPOINTS = 10


class Addresses(Policy):
    name = "addresses"
    apis: ClassVar[frozenset[int]] = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, FETCH, PRODUCE,
                                                SHARE_FETCH, SHARE_ACKNOWLEDGE})

    def __init__(self, services: Services) -> None:
        self.router = services.router
        rewrite = self.router.rewrite_nodes
        #: Fetch v16+ response walkers, one factory per version (made once, not per request)
        self._streamers = {v: functools.partial(FetchStreamer, v, rewrite=rewrite)
                           for v in range(FIRST_NODE_ENDPOINTS, MAX_VERSION + 1)}
        #: per API, the versions Sluice decodes or relays as bytes (Produce v0-9, KAFKA-18659)
        self._versions = {key: negotiable_versions(key) for key in self.apis}

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        key, version = ex.header.api_key, ex.header.api_version
        ours = self._versions[key]
        if ours is None or not ours.low <= version <= ours.high:
            # A client that read Sluice's ApiVersions never sends this; its response could not be read, and
            # relaying it unread could hand the client a broker address.
            raise Rejected("unsupported_version",
                           f"{ex.api} v{version} is outside the versions Sluice decodes ({ours})")
        if key == FETCH:
            if version < FIRST_NODE_ENDPOINTS:
                return None  # no NodeEndpoints before KIP-951: relay as bytes
            ex.streamer = self._streamers[version]
            return True
        if key == PRODUCE and version < FIRST_PRODUCE_ENDPOINTS:
            return None
        ex.collect = True
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        router = self.router
        if isinstance(response, FetchResponse):
            if response.view.node_endpoints:
                router.rewrite_nodes(response.view.node_endpoints)
                response.changed = True
            return
        if isinstance(response, MetadataHead):
            router.rewrite_metadata(response.head)
            response.changed = True
            return
        assert isinstance(response, MessageResponse)
        key = ex.header.api_key
        if key == PRODUCE:
            if response.top_level_tags_empty():
                return
            router.rewrite_node_endpoints(response.body)
        elif key == FIND_COORDINATOR:
            router.rewrite_find_coordinator(response.body)
        elif key == DESCRIBE_CLUSTER:
            router.rewrite_describe_cluster(response.body)
        elif key in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
            # a regular field here, empty unless a partition's leader moved: re-encode only then
            if not response.body.node_endpoints:
                return
            router.rewrite_node_endpoints(response.body)
        response.changed = True
