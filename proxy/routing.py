"""Broker node id <-> local listener, and the rewriting that keeps clients from learning real broker addresses.

Kafka clients bootstrap from one address and then connect to whatever host:port the cluster advertises in
Metadata (brokers), FindCoordinator (group/transaction coordinators), DescribeCluster (admin clients) and,
since KIP-951, in the NodeEndpoints tagged field of Fetch (v16+) and Produce (v10+) responses. Sluice gives
every broker node its own local listener (port = broker_port_base + node id) and rewrites each of those
responses to the advertised host and that port, remembering the real address so the listener knows where
to connect. Sans-IO: the server asks the router, the router never opens sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .wire.model import Message

Address = tuple[str, int]


@dataclass
class Router:
    advertised_host: str
    broker_port_base: int
    #: node id -> the broker's real (host, port), learned from responses
    upstream: dict[int, Address] = field(default_factory=dict)

    def port_for(self, node_id: int) -> int:
        return self.broker_port_base + node_id

    def learn(self, node_id: int, host: str, port: int) -> bool:
        """Record a broker's real address; True when the node is new (the server opens its listener)."""
        new = node_id not in self.upstream
        self.upstream[node_id] = (host, port)
        return new

    def _rewrite_node(self, node: Message, new_nodes: list[int], *, id_field: str = "node_id") -> None:
        node_id = getattr(node, id_field)
        if node_id < 0 or node.port < 0:
            return  # "no node" placeholders (e.g. FindCoordinator errors: -1, "", -1) stay as they are
        if self.learn(node_id, node.host, node.port):
            new_nodes.append(node_id)
        node.host = self.advertised_host
        node.port = self.port_for(node_id)

    def rewrite_metadata(self, body: Message) -> list[int]:
        """MetadataResponse.Brokers -> advertised addresses. Returns node ids seen for the first time."""
        new: list[int] = []
        for broker in body.brokers:
            self._rewrite_node(broker, new)
        return new

    def rewrite_find_coordinator(self, body: Message) -> list[int]:
        """FindCoordinator v0-3 carries one coordinator at the top level; v4+ a list (KIP-699 batching)."""
        new: list[int] = []
        if "coordinators" in body.fields():
            for coordinator in body.coordinators:
                self._rewrite_node(coordinator, new, id_field="node_id")
        elif body.error_code == 0:
            self._rewrite_node(body, new, id_field="node_id")
        return new

    def rewrite_describe_cluster(self, body: Message) -> list[int]:
        """DescribeCluster brokers (endpoint type 1). Controller endpoints (type 2, KIP-919) are left alone:
        their ids are controller ids that may coincide with broker ids in combined mode, so they cannot
        share the broker port mapping; Sluice does not proxy the controller listener."""
        new: list[int] = []
        if body.get("endpoint_type", 1) != 1:
            return new
        for broker in body.brokers:
            self._rewrite_node(broker, new, id_field="broker_id")
        return new

    def rewrite_node_endpoints(self, body: Message) -> list[int]:
        """KIP-951 NodeEndpoints (Fetch v16+, Produce v10+): leaders a client should move to."""
        new: list[int] = []
        for node in body.get("node_endpoints") or ():
            self._rewrite_node(node, new)
        return new
