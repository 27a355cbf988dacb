"""Known records to produce, and the one check every client test makes of what came back."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Message

from rig.kafka import end_offsets


@dataclass(frozen=True)
class Rec:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


def make_records(n: int, partitions: int, *, value_size: int = 100, tag: str = "") -> list[Rec]:
    """n distinct records spread round-robin over partitions; every field distinct per record."""
    base_ts = int(time.time() * 1000) - 60_000
    out = []
    for i in range(n):
        key = f"key-{tag}-{i}".encode()
        body = f"value-{tag}-{i}-".encode()
        value = (body * (value_size // len(body) + 1))[:value_size] if value_size else b""
        headers = (("h-index", str(i).encode()), ("h-tag", tag.encode()))
        out.append(Rec(i % partitions, key, value, headers, base_ts + i))
    return out


def assert_same_records(produced: list[Rec], consumed: list[Rec], *, check_headers: bool = True,
                        check_timestamps: bool = True, stored_in: tuple[str, str] | None = None) -> None:
    """Every produced record arrives exactly once, in order within its partition, unchanged. ``stored_in``
    (bootstrap, topic): the records were sent there through the path under test and read until as many had come
    as were sent; the topic's log must then hold no more than that (:func:`assert_log_holds`)."""
    want: dict[int, list[Rec]] = defaultdict(list)
    got: dict[int, list[Rec]] = defaultdict(list)
    for r in produced:
        want[r.partition].append(r)
    for r in consumed:
        got[r.partition].append(r)
    assert sorted(got) == sorted(want), f"partitions {sorted(got)} != {sorted(want)}"

    def norm(r: Rec) -> tuple[object, ...]:
        return (r.key, r.value, r.headers if check_headers else (), r.timestamp_ms if check_timestamps else 0)

    for p in want:
        w = [norm(r) for r in want[p]]
        g = [norm(r) for r in got[p]]
        assert len(g) == len(w), f"partition {p}: consumed {len(g)} records, produced {len(w)}"
        for i, (a, b) in enumerate(zip(w, g, strict=True)):
            assert a == b, f"partition {p} record {i}: produced {a!r}, consumed {b!r}"
    if stored_in is not None:
        assert_log_holds(*stored_in, sent_per_partition(produced))


def rec_of(m: Message) -> Rec:
    """A confluent-kafka message as a :class:`Rec` (its headers' values are bytes: the tests send no null one)."""
    partition, raw = m.partition(), m.headers() or []
    assert partition is not None, m
    headers = list(raw.items()) if isinstance(raw, dict) else list(raw)
    values = [(k, v) for k, v in headers if isinstance(v, bytes)]
    assert len(values) == len(headers), f"a header without a value: {headers}"
    return Rec(partition, m.key(), m.value(), tuple(values), m.timestamp()[1])


def sent_per_partition(produced: Iterable[Rec]) -> dict[int, int]:
    return dict(Counter(r.partition for r in produced))


def log_differs(ends: Mapping[int, int], sent: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """Partitions whose log does not end where the records sent to a new topic would: partition -> (end offset,
    records sent)."""
    return {p: (ends.get(p, 0), sent.get(p, 0)) for p in {*ends, *sent} if ends.get(p, 0) != sent.get(p, 0)}


def assert_log_holds(bootstrap: str, topic: str, sent: Mapping[int, int]) -> None:
    """The new topic's log holds exactly the records sent, per partition (``sent``: partition -> count): a reader
    that stops once it has as many records as were sent cannot see a record stored twice after them; the log's end
    offsets, asked of the broker, show it."""
    differs = log_differs(end_offsets(bootstrap, topic), sent)
    assert not differs, f"{topic}: partition -> (end offset, records sent): {differs}"
