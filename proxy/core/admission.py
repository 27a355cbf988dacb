"""Connection admission: the bound on client connections in total and per client address, sans-IO.

Kafka's broker does this at accept (SocketServer's ConnectionQuotas): a connection over ``max.connections`` or
``max.connections.per.ip`` is closed at once, before a byte of it is read, and the client sees the connection
closed and retries after its backoff. Sluice does the same, counting by the client's real address (the PROXY
protocol's source when the listener reads one, so clients behind one load balancer are told apart).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["Admission", "RefuseReason"]

RefuseReason = Literal["max_connections", "max_connections_per_address"]


class Admission:
    """Counts admitted connections; 0 as a bound means none."""

    def __init__(self, max_total: int = 0, max_per_address: int = 0) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        self.total = 0
        self._by_address: dict[str, int] = {}

    def admit(self, address: str) -> RefuseReason | None:
        """Count a new connection from ``address`` (a host, no port), or say why it is refused (not counted)."""
        if self.max_total and self.total >= self.max_total:
            return "max_connections"
        here = self._by_address.get(address, 0)
        if self.max_per_address and here >= self.max_per_address:
            return "max_connections_per_address"
        self.total += 1
        self._by_address[address] = here + 1
        return None

    def release(self, address: str) -> None:
        """An admitted connection from ``address`` closed."""
        here = self._by_address.get(address, 0)
        if here <= 0:
            return
        self.total -= 1
        if here == 1:
            del self._by_address[address]
        else:
            self._by_address[address] = here - 1

    def count(self, address: str) -> int:
        return self._by_address.get(address, 0)
