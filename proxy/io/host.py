"""What the I/O layer needs of the Sluice it serves: :class:`ConnectionHost`, the narrow interface a listener and
the client connections it accepts act through (``proxy.server.Proxy`` implements it).

The I/O layer imports no server module and touches no attribute the host does not name here, so the arrows go one
way (server -> io -> core) and a test can host a listener with anything that has these members.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..config.sections import LimitsSettings, UpstreamSettings
    from ..core.admission import Admission
    from ..core.connection import Connection, Port
    from ..core.exchange import ConnectionInfo
    from ..core.routing import Address
    from ..metrics import Metrics
    from ..tls import TlsContexts

__all__ = ["ConnectionHost"]


class ConnectionHost(Protocol):
    """The Sluice a listener and its client connections belong to."""

    #: the loop every listener accepts on (set when the host starts)
    loop: asyncio.AbstractEventLoop | None
    #: the TLS contexts in force: a listener's for each accepted connection, the upstream's for each connect
    tls: TlsContexts
    #: the connection limits counted at accept and released at teardown
    admission: Admission
    metrics: Metrics
    #: client transports Sluice closed that are not gone yet (their last bytes still going out, the client's FIN
    #: awaited: transports.ClientProtocol.close_client): shutdown waits for them, so the exit cuts none
    closing: set[object]

    @property
    def limits(self) -> LimitsSettings:
        """[limits] in force now (write buffer water marks, the timeouts of a connection's first steps)."""
        ...

    @property
    def upstream(self) -> UpstreamSettings:
        """[upstream] in force now (the connect timeout)."""
        ...

    def connection(self, info: ConnectionInfo, port: Port) -> Connection:
        """The core of a new client connection, acting through ``port``."""
        ...

    def opened(self, conn: Connection) -> None:
        """``conn``'s client transport is up: the host counts it among its connections (drained at shutdown)."""
        ...

    def closed(self, conn: Connection) -> None:
        """``conn`` is torn down."""
        ...

    def next_connection_id(self) -> int:
        ...

    async def upstream_address(self, node_id: int | None) -> list[Address]:
        """Where the upstream connection of a client of listener ``node_id`` (None: bootstrap) goes."""
        ...

    def connect_failed(self, node_id: int | None, error: str, upstream: Sequence[Address] = ()) -> None:
        """An upstream connect failed (the host logs it, rate-limited)."""
        ...
