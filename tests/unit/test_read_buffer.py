"""proxy/io/read_buffer.py: reads land in one buffer while nothing holds the last read, and never under a holder."""

from __future__ import annotations

from proxy.io.read_buffer import ReadBuffer


def read(reads: ReadBuffer, data: bytes, sizehint: int = 0) -> memoryview:
    """What a transport does: fill the buffer it is handed, then say how much it put there."""
    buf = reads.get(sizehint or len(data))
    buf[: len(data)] = data
    del buf
    return reads.got(len(data))


def test_a_read_released_leaves_the_buffer_for_the_next() -> None:
    reads = ReadBuffer(64)
    first = read(reads, b"a" * 10)
    assert first == b"a" * 10
    first.release()
    second = read(reads, b"b" * 20)
    assert second == b"b" * 20
    assert reads.renewed == 0


def test_a_read_still_held_is_never_overwritten() -> None:
    reads = ReadBuffer(64)
    held = read(reads, b"a" * 10)[2:6]  # a slice kept past the read, as a queued write keeps it
    second = read(reads, b"b" * 20)
    assert bytes(held) == b"aaaa"
    assert second == b"b" * 20
    assert reads.renewed == 1
    held.release()
    second.release()
    read(reads, b"c" * 5)
    assert reads.renewed == 1  # the new buffer is reused once nothing holds it


def test_the_buffer_grows_to_what_the_transport_asks_for() -> None:
    reads = ReadBuffer(16)
    assert len(reads.get(100)) >= 100
    big = read(reads, b"x" * 100)
    assert big == b"x" * 100
    big.release()
    assert len(reads.get(16)) >= 100  # kept at its new size


def test_a_read_is_read_only_as_bytes_are() -> None:
    reads = ReadBuffer(16)
    got = read(reads, b"abcd")
    assert got.readonly
    assert bytes(got[1:3]) == b"bc"
