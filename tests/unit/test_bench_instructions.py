"""bench.instructions --cold: the cache misses read from callgrind's output."""

from __future__ import annotations

from pathlib import Path

from bench.instructions import cache_misses


def test_cold_misses_are_the_last_level_misses_and_l1_the_first_levels(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    # the header and totals lines as callgrind 3.19 writes them with --cache-sim=yes
    out.write_text("# callgrind format\nversion: 1\nevents: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
                   "fl=(1) x.c\nfn=(1) f\n0 10 4 2 3 2 1 2 1 1\n"
                   "totals: 1000 400 200 30 20 10 7 5 3\n")
    assert cache_misses(out) == (7 + 5 + 3, 30 + 20 + 10)

