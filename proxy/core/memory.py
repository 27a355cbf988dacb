"""The proxy-wide bound on response bytes held in Sluice (set by a policy's section: ``Registration.memory_bound``).
Sans-IO.

KIP-74's memory bound for a broker is ``min(N * max_bytes, ...)``; a proxy that buffers whole responses needs
one of its own. A request whose response a policy will hold whole (``Exchange.reserve``) reserves its bytes before
it goes upstream; the connection core waits, in arrival order across connections, when the bound is reached,
instead of allocating, and releases the bytes once the client's transport has taken the response.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class HeldBytes:
    """A global bound on response bytes held in Sluice: reservations granted in arrival order.

    ``reserve(n, grant)`` calls ``grant()`` at once when ``n`` fits (a reservation larger than the bound
    waits until nothing else is held, so it always makes progress), else queues it; ``release(n)`` grants
    waiting reservations, oldest first. Unbounded when ``limit`` is 0.
    """

    def __init__(self, limit: int = 0, on_change: Callable[[int], None] | None = None) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: deque[tuple[int, Callable[[], None]]] = deque()
        self._on_change = on_change

    def _fits(self, n: int) -> bool:
        return not self.limit or self.held == 0 or self.held + n <= self.limit

    def reserve(self, n: int, grant: Callable[[], None]) -> bool:
        """True if granted now (``grant`` is not called then); False if queued."""
        if not self._waiting and self._fits(n):
            self._add(n)
            return True
        self._waiting.append((n, grant))
        return False

    def adjust(self, delta: int) -> None:
        """A response turned out larger (or smaller) than reserved."""
        self._add(delta)
        if delta < 0:
            self._grant()

    def release(self, n: int) -> None:
        self._add(-n)
        self._grant()

    def cancel(self, grant: Callable[[], None]) -> None:
        """Drop a queued reservation (its connection closed)."""
        self._waiting = deque(w for w in self._waiting if w[1] != grant)  # bound methods compare by ==
        self._grant()

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._grant()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _add(self, delta: int) -> None:
        self.held += delta
        if self._on_change is not None:
            self._on_change(self.held)

    def _grant(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            n, grant = self._waiting.popleft()
            self._add(n)
            grant()
