"""One buffer that a connection's reads land in, reused for the next read while nothing still holds a view of it.

Why: under TLS, uvloop's SSL transport (like asyncio's) decrypts each TLS record (at most 16 KiB, RFC 8446
section 5.1) into a ``bytes`` object of its own, allocated at 256 KiB and shrunk, and joins a read's records into
one more ``bytes`` for ``data_received``: a copy of every byte relayed, on top of the decryption's own. A
BufferedProtocol has the records decrypted straight into the buffer it hands out instead.

Reuse is what makes that pay (a new buffer per read costs its zero-filling, what the join cost), and it is only
safe while no one holds the bytes of the last read: a write the transport queued, a header kept for the next read.
Every such holder keeps a view of the buffer, and CPython refuses to resize a ``bytearray`` with live views
(``BufferError``), so :meth:`ReadBuffer.get` asks exactly that: held, it leaves the old buffer to its holders and
makes a new one. Nothing read into it is ever overwritten under a holder.
"""

from __future__ import annotations

__all__ = ["ReadBuffer"]


class ReadBuffer:
    """The buffer for the next read (:meth:`get`) and a read-only view of what a read put in it (:meth:`got`)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._buf = bytearray(size)
        #: buffers made because the last one was still held (for tests and profiles)
        self.renewed = 0

    def get(self, sizehint: int) -> memoryview:
        """Where the next read goes: the buffer, at least ``sizehint`` bytes, unless a view of it is still held."""
        buf = self._buf
        if len(buf) < sizehint:
            self._buf = buf = bytearray(sizehint)
        elif self._held(buf):
            self.renewed += 1
            self._buf = buf = bytearray(max(self._size, sizehint))
        return memoryview(buf)

    def got(self, nbytes: int) -> memoryview:
        """The ``nbytes`` the last read put at the start of the buffer, read-only as ``bytes`` are."""
        return memoryview(self._buf)[:nbytes].toreadonly()

    @staticmethod
    def _held(buf: bytearray) -> bool:
        # A resize is refused while any view of the buffer is alive (bytearray's export count); the byte added is
        # taken off again, so the size stays and the allocation grows once by bytearray's over-allocation.
        try:
            buf.append(0)
        except BufferError:
            return True
        del buf[-1]
        return False
