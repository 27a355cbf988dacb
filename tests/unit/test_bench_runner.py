"""bench/__main__.py: the benches are the modules of bench/ (what they share lives in bench/support/, never run as a
bench), each takes the options every bench takes (--smoke, --check: bench/support/verdict.py), and a smoke run
passes only with a summary line carrying the verdict."""

from __future__ import annotations

import json
from pathlib import Path

from bench.__main__ import HERE, benches, last_summary


def test_the_benches_are_the_modules_of_bench_and_each_takes_smoke_and_check() -> None:
    names = benches()
    assert {"passthrough", "quota", "sharing", "soak", "fuzz"} <= set(names)
    assert not {"verdict", "profiling", "revision", "gen_logs", "support", "__main__", "__init__"} & set(names)
    for name in names:
        source = (HERE / f"{name}.py").read_text()
        assert "add_options(" in source, f"bench.{name} does not take --smoke and --check (verdict.add_options)"
    assert all(Path(HERE / "support" / f"{lib}.py").is_file() for lib in ("verdict", "profiling", "revision"))


def test_a_smoke_run_passes_only_with_a_verdict_as_its_last_line() -> None:
    line = {"summary": "x", "goals": {}, "met": True, "errors": [], "correct": True}
    assert last_summary(f'{{"bench": "x"}}\n{json.dumps(line)}\n') == line
    assert last_summary(json.dumps({"summary": "x", "lost": 0})) is None  # the old shape: no verdict
    assert last_summary(f'{json.dumps(line)}\n{{"bench": "x"}}') is None  # not the last line
    assert last_summary("") is None and last_summary("Traceback (most recent call last):") is None
