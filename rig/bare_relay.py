"""A bare TCP relay: the least a Python proxy can do (bytes in, bytes out, no Kafka parsing), on the same event loop
(uvloop), Protocols and backpressure marks as Sluice. bench/passthrough.py measures Sluice's CPU against it.

``python -m rig.bare_relay LISTEN_PORT UPSTREAM_HOST:PORT``: relays every connection to LISTEN_PORT (127.0.0.1) to
the upstream until SIGTERM, then prints ``{"bytes_to_client": N}`` and exits. For Kafka clients to stay on it, the
broker must advertise the relay's port on the listener it connects to (bench/passthrough.py adds a listener).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from typing import Any

import uvloop

HIGH, LOW = 4 * 1024 * 1024, 1024 * 1024  # Sluice's defaults (limits.write_high/low_water_bytes)


class _Side(asyncio.Protocol):
    def __init__(self, relay: _Relay, client: bool) -> None:
        self.relay = relay
        self.client = client
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(HIGH, LOW)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.relay.forward(self.client, data)

    def pause_writing(self) -> None:
        self.relay.other(self.client).pause_reading()

    def resume_writing(self) -> None:
        self.relay.other(self.client).resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()


class _Relay:
    counted = 0

    def __init__(self) -> None:
        self.client = _Side(self, True)
        self.upstream = _Side(self, False)
        self.pending: list[bytes] = []
        self.task: asyncio.Task[None] | None = None

    def other(self, client: bool) -> Any:
        side = self.upstream if client else self.client
        return side.transport

    def forward(self, from_client: bool, data: bytes) -> None:
        if from_client:
            if self.upstream.transport is None:
                self.pending.append(data)
                return
            self.upstream.transport.write(data)
        else:
            _Relay.counted += len(data)
            self.client.transport.write(data)

    def close(self) -> None:
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()


async def main(port: int, upstream: str) -> None:
    host, _, up_port = upstream.rpartition(":")
    loop = asyncio.get_running_loop()

    def accepted() -> _Side:
        relay = _Relay()

        async def connect() -> None:
            await loop.create_connection(lambda: relay.upstream, host, int(up_port))
            for data in relay.pending:
                relay.upstream.transport.write(data)
            relay.pending.clear()

        relay.task = loop.create_task(connect())
        return relay.client

    server = await loop.create_server(accepted, "127.0.0.1", port, reuse_address=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps({"listening": port}), flush=True)
    await stop.wait()
    server.close()
    print(json.dumps({"bytes_to_client": _Relay.counted}), flush=True)


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), sys.argv[2]))
