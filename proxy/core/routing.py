"""Broker node id <-> local listener, and the rewriting that keeps clients from learning real broker addresses.

Kafka clients bootstrap from one address and then connect to whatever host:port the cluster advertises in
Metadata (brokers), FindCoordinator (group/transaction coordinators), DescribeCluster (admin clients) and,
since KIP-951, in the NodeEndpoints tagged field of Fetch (v16+) and Produce (v10+) responses. Sluice gives
every broker node its own local listener (port = broker_port_base + node id) and rewrites each of those
responses to the advertised host and that port, remembering the real address so the listener knows where
to connect. Sans-IO: the server asks the router, the router never opens sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..wire.model import Message

Address = tuple[str, int]
#: a broker node's id and real address, as a response named it
Node = tuple[int, str, int]


@dataclass
class Router:
    advertised_host: str
    broker_port_base: int
    #: opens the local listener for a node and returns its port (base + node id, or any free port when the
    #: base is 0); injected by the server, which owns sockets. Called before a response naming the port is
    #: sent, so a client never races its listener.
    open_listener: Callable[[int], int] | None = None
    #: node id -> the broker's real (host, port), learned from responses
    upstream: dict[int, Address] = field(default_factory=dict)
    #: node id -> Sluice's listener port for it
    ports: dict[int, int] = field(default_factory=dict)

    def port_for(self, node_id: int) -> int:
        port = self.ports.get(node_id)
        if port is None:
            port = self.open_listener(node_id) if self.open_listener else self.broker_port_base + node_id
            self.ports[node_id] = port
        return port

    def learn(self, node_id: int, host: str, port: int) -> None:
        """Record a broker's real address (brokers may move: the latest response wins)."""
        self.upstream[node_id] = (host, port)

    def _rewrite_node(self, node: Any, *, id_field: str = "node_id") -> Node | None:
        """``node`` rewritten in place; its id and real address (None: a placeholder, left as it is)."""
        node_id = getattr(node, id_field)
        if node_id < 0 or node.port < 0:
            return None  # "no node" placeholders (e.g. FindCoordinator errors: -1, "", -1) stay as they are
        learned = (node_id, node.host, node.port)
        self.learn(*learned)
        node.host = self.advertised_host
        node.port = self.port_for(node_id)
        return learned

    def rewrite_metadata(self, body: Message) -> list[Node]:
        """MetadataResponse.Brokers -> advertised addresses; the brokers' real addresses learned (:meth:`learn`)."""
        learned = []
        for broker in body.brokers:
            node = self._rewrite_node(broker)
            if node is not None:
                learned.append(node)
        return learned

    def rewrite_find_coordinator(self, body: Message) -> None:
        """FindCoordinator v0-3 carries one coordinator at the top level; v4+ a list (KIP-699 batching)."""
        if "coordinators" in body.fields():
            for coordinator in body.coordinators:
                self._rewrite_node(coordinator, id_field="node_id")
        elif body.error_code == 0:
            self._rewrite_node(body, id_field="node_id")

    def rewrite_describe_cluster(self, body: Message) -> None:
        """DescribeCluster brokers (endpoint type 1). Controller endpoints (type 2, KIP-919) are left alone:
        their ids are controller ids that may coincide with broker ids in combined mode, so they cannot
        share the broker port mapping; Sluice does not proxy the controller listener."""
        if body.get("endpoint_type", 1) != 1:
            return
        for broker in body.brokers:
            self._rewrite_node(broker, id_field="broker_id")

    def rewrite_node_endpoints(self, body: Any) -> None:
        """KIP-951 NodeEndpoints (Fetch v16+, Produce v10+): leaders a client should move to. ``body`` is a
        decoded Message or a fetch_fast view; both expose ``node_endpoints`` entries with node_id/host/port."""
        self.rewrite_nodes(getattr(body, "node_endpoints", None) or ())

    def rewrite_nodes(self, nodes: Iterable[Any]) -> None:
        """Rewrite node entries (anything with node_id/host/port) in place."""
        for node in nodes:
            self._rewrite_node(node)
