"""Known records to produce, and the one check every client test makes of what came back."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass


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
                        check_timestamps: bool = True) -> None:
    """Every produced record arrives exactly once, in order within its partition, unchanged."""
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
