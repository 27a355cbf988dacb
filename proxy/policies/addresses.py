"""Clients never learn a broker's real address: every response that carries one is rewritten to Sluice's
advertised host and the port of the node's listener (rules in :mod:`proxy.core.routing`).

Metadata (brokers), FindCoordinator (coordinators, batched or not), DescribeCluster (brokers), since KIP-951 the
NodeEndpoints tagged field of Fetch (v16+) and Produce (v10+) responses, and the NodeEndpoints of ShareFetch and
ShareAcknowledge responses (KIP-932, every version: a partition's new leader after NOT_LEADER_OR_FOLLOWER; measured
on Kafka 4.3 with them relayed, a share consumer connected to the broker's real address). A Fetch v16+ response streams
through with only its final tag section held back and rewritten (:mod:`proxy.wire.fetch_stream`) unless another
policy collects it whole; a Produce response's tag section is skimmed and the response relayed untouched when it
carries no endpoints (they appear only after a leadership change).

A Metadata response is rewritten bytes in, bytes out on the core's shortest path (:class:`Relay` ``rewrite``): no
Exchange, no policy hook, and the same response bytes, which a broker sends again while its cluster does not change
(each new connection's first Metadata, each client's refresh every metadata.max.age.ms), answered from a memo
(:class:`MetadataAnswers`). The soak's probe (bench.soak: the same Metadata request through Sluice, through the
bare relay and straight to the broker) measured what Sluice adds over the bare relay's path at the median fall from
~0.22 ms to ~0.07 ms: the Exchange path's code, brought back in from cold caches on every request on a busy machine,
was most of it (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import functools
from typing import Any

from ..core.exchange import Buffer, Exchange, Relay
from ..core.policy import Policy, Services, Streamed, reads
from ..core.routing import Node, Router
from ..wire.api_keys import ApiKey
from ..wire.fetch_layout import FIRST_NODE_ENDPOINTS, MAX_VERSION
from ..wire.fetch_stream import FetchStreamer
from ..wire.views import FetchResponse, MessageResponse, MetadataHead, ResponseView, tags_empty

#: the first Produce version with KIP-951 NodeEndpoints (ProduceResponse.json)
FIRST_PRODUCE_ENDPOINTS = 10
#: Metadata answers remembered (:class:`MetadataAnswers`): one per distinct response (the topics a client asks of
#: one broker); past this many the memo starts again
METADATA_MEMO_ENTRIES = 64
#: responses larger than this are rewritten every time, not remembered (~600 partitions' worth): a large cluster's
#: (10,000 partitions are ~260 KB) has only its head decoded anyway, and the memo holds at most ~2 MiB (each entry
#: the response and its answer), beside a sidecar's ~40 MiB at rest (bench.footprint)
METADATA_MEMO_MAX_BYTES = 16 * 1024


class MetadataAnswers:
    """Metadata responses with their brokers' addresses rewritten (:meth:`Router.rewrite_metadata`), the answer to
    the same bytes remembered: the answer depends only on the response's bytes and the router's ports, which never
    change for a node once given. What a response teaches the router (each broker's real address) is taught again
    on every answer from the memo, so the latest response still wins (a broker that moved and moved back)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        #: (version, the response after its correlation id) -> (the answer after its correlation id, the brokers)
        self._memo: dict[tuple[int, bytes], tuple[bytes, list[Node]]] = {}

    def rewrite(self, version: int, frame: Buffer) -> bytes:
        """``frame`` (a Metadata response of ``version`` after its size prefix) as the client gets it (the same
        layout). CodecError if it is malformed."""
        rest = bytes(frame[4:])
        key = (version, rest)
        known = self._memo.get(key)
        if known is not None:
            answer, nodes = known
            learn = self.router.learn
            for node in nodes:
                learn(*node)
            return bytes(frame[:4]) + answer
        view = MetadataHead(version, frame)
        nodes = self.router.rewrite_metadata(view.head)
        view.changed = True
        buffers, _ = view.encode()
        out = b"".join(buffers[1:])  # its size prefix is the core's to write
        if len(rest) <= METADATA_MEMO_MAX_BYTES:
            if len(self._memo) >= METADATA_MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = (out[4:], nodes)
        return out


class Addresses(Policy):
    name = "addresses"

    def __init__(self, services: Services) -> None:
        self.apis = reads(ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER, ApiKey.FETCH,
                          ApiKey.PRODUCE, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE)
        self.router = services.router
        rewrite = self.router.rewrite_nodes
        #: Fetch v16+ response walkers, one factory per version (made once, not per request)
        self._streamers = {v: functools.partial(FetchStreamer, v, rewrite=rewrite)
                           for v in range(FIRST_NODE_ENDPOINTS, MAX_VERSION + 1)}
        metadata = self.apis[ApiKey.METADATA]
        answers = MetadataAnswers(self.router)
        #: Metadata responses rewritten bytes in, bytes out, one function per version (made once)
        self._metadata = {v: functools.partial(answers.rewrite, v) for v in range(metadata.low, metadata.high + 1)}

    def unread(self, api_key: int, version: int) -> bool | Relay:
        """Produce before v10 and Fetch before v16 carry no address (KIP-951); a Produce v10+ response is read
        only when it carries NodeEndpoints (the skim finds its top-level tag section non-empty), a Fetch v16+
        response is walked as it streams (its last bytes are NodeEndpoints' place), a Metadata response rewritten
        bytes in, bytes out (:class:`MetadataAnswers`)."""
        if api_key == ApiKey.METADATA:
            return Relay(rewrite=self._metadata[version])
        if api_key == ApiKey.PRODUCE:
            return True if version < FIRST_PRODUCE_ENDPOINTS else Relay(check=tags_empty(api_key, version))
        if api_key == ApiKey.FETCH:
            return True if version < FIRST_NODE_ENDPOINTS else Relay(streamer=self._streamers[version])
        return False

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        key, version = ex.header.api_key, ex.header.api_version
        if key == ApiKey.FETCH:
            if version < FIRST_NODE_ENDPOINTS:
                return None  # no NodeEndpoints before KIP-951: relay as bytes
            ex.streamer = self._streamers[version]
            return True
        if key == ApiKey.PRODUCE:
            if version < FIRST_PRODUCE_ENDPOINTS:
                return None
            # NodeEndpoints come only after a leader moved (KIP-951): a response without a top-level tagged
            # field is relayed unread (on every producer's request)
            ex.relay_if = tags_empty(key, version)
        ex.collect = True
        return True

    def stream_fetch(self, ex: Exchange, size: int, conn: Any, state: Any) -> Streamed:
        """A Fetch v16+ response streams through with its NodeEndpoints rewritten (``ex.streamer``'s walk) when the
        other policies reading it need it no more whole than this one."""
        return Streamed()

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
        if key == ApiKey.PRODUCE:
            if response.top_level_tags_empty():
                return
            router.rewrite_node_endpoints(response.body)
        elif key == ApiKey.FIND_COORDINATOR:
            router.rewrite_find_coordinator(response.body)
        elif key == ApiKey.DESCRIBE_CLUSTER:
            router.rewrite_describe_cluster(response.body)
        elif key in (ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE):
            # a regular field here, empty unless a partition's leader moved: re-encode only then
            if not response.body.node_endpoints:
                return
            router.rewrite_node_endpoints(response.body)
        response.changed = True
