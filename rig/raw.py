"""A raw Kafka client on one socket, built from Sluice's own codecs: for tests and benches that must control
exactly what is sent (a fetch loop that never rotates, a long poll, ...); and :func:`recv_exact`, the one way
they read a length-prefixed frame off a blocking socket."""

from __future__ import annotations

import socket
import struct
from typing import Any

from proxy.wire.fetch_fast import FetchResponseView, decode_frame
from proxy.wire.messages import decode_response, encode_request, request_codec
from proxy.wire.model import Message


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``; ConnectionError if the peer closes first."""
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


class RawClient:
    def __init__(self, host: str, port: int, client_id: str = "raw-test", timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.client_id = client_id
        self._corr = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, api_key: int, version: int, body: Message) -> int:
        self._corr += 1
        header = Message(request_api_key=api_key, request_api_version=version, correlation_id=self._corr,
                         client_id=self.client_id)
        frame = encode_request(header, body)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        return self._corr

    def receive(self) -> bytes:
        (size,) = struct.unpack(">i", recv_exact(self.sock, 4))
        return recv_exact(self.sock, size)

    def request(self, api_key: int, version: int, body: Message) -> Message:
        self.send(api_key, version, body)
        return decode_response(api_key, version, self.receive())[1]

    def topic_ids(self, topics: list[str]) -> dict[str, bytes]:
        """Each topic's id (KIP-516), from a Metadata v12 request on this connection (e.g. sent straight to the
        broker, so the proxy under test never sees it)."""
        body = request_codec(3, 12).default().replace(
            topics=[Message(topic_id=bytes(16), name=t) for t in topics], allow_auto_topic_creation=False)
        answer = self.request(3, 12, body)
        ids = {t.name: bytes(t.topic_id) for t in answer.topics if t.error_code == 0}
        if set(ids) != set(topics):
            raise ValueError(f"Metadata named {sorted(ids)}, not {sorted(topics)}: {answer.topics}")
        return ids

    def fetch(self, version: int, topic: str, offsets: dict[int, int], *, max_bytes: int = 50 << 20,
              partition_max_bytes: int = 1 << 20, max_wait_ms: int = 500, session_id: int = 0,
              session_epoch: int = -1, topic_id: bytes | None = None) -> FetchResponseView:
        """A fetch of ``topic``'s partitions, in the order given: session-less (epoch -1) unless a KIP-227
        session id / epoch is given (then ``offsets`` lists only the partitions to add or change). From v13
        topics are named by id only (KIP-516): ``topic_id`` is required there (``topic`` is then only a label)."""
        if version >= 13 and topic_id is None:
            raise ValueError(f"Fetch v{version} names topics by id: pass topic_id (see topic_ids)")
        body = request_codec(1, version).default()
        fields: dict[str, Any] = {"replica_id": -1} if version < 15 else {}
        key: dict[str, Any] = {"topic_id": topic_id} if version >= 13 else {"topic": topic}
        body = body.replace(max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                            session_id=session_id, session_epoch=session_epoch, **fields,
                            topics=[Message(**key, partitions=[
                                Message(partition=p, current_leader_epoch=-1, fetch_offset=off,
                                        last_fetched_epoch=-1, log_start_offset=-1,
                                        partition_max_bytes=partition_max_bytes)
                                for p, off in offsets.items()])],
                            forgotten_topics_data=[], rack_id="")
        self.send(1, version, body)
        return decode_frame(self.receive(), version)[2]
