"""rig/group_consumer.py's ConsumerProcess as the sharing tests use it, on stand-in processes (no broker): a
consumer that dies is named with its exit code and stderr, one told to end is not a failure, and stop_all ends a
group together."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rig.group_consumer import ConsumerProcess, stop_all


def process(code: str) -> ConsumerProcess:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return ConsumerProcess(proc, name="stand-in")


def test_a_consumer_that_died_is_named_with_its_exit_code_and_stderr() -> None:
    c = process('import json, sys; print(json.dumps({"rs": [[0, 5, "k", "v"]]}), flush=True); '
                'sys.stderr.write("Traceback: the client gave up\\n"); sys.exit(3)')
    c.proc.wait(30)
    with pytest.raises(AssertionError, match=r"consumer stand-in exited with 3:\n.*the client gave up"):
        c.check_alive()
    description = c.describe()
    assert "exited 3" in description and '"rs"' in description and "the client gave up" in description
    stop_all([c])
    assert not c.stderr_path.exists()  # removed with the stopped consumer


def test_one_told_to_end_is_not_a_failure_and_stop_all_ends_them_together() -> None:
    group = [process("import time; time.sleep(600)") for _ in range(3)]
    for c in group:
        c.check_alive()  # running
    stop_all(group, timeout=20)
    assert all(c.proc.poll() is not None for c in group)
    for c in group:
        c.check_alive()  # ended, as asked
        assert "(asked to)" in c.describe()


def test_a_description_tells_the_consumers_assignments_not_only_its_last_report() -> None:
    c = process('import json; [print(json.dumps(e), flush=True) for e in ({"assigned": [["t", 0]]}, '
                '{"rs": [[0, 5, "k", "v"]]}, {"commit": {"0": 6}}, {"assigned": []}, {"rs": [[1, 7, "k", "v"]]})]')
    c.proc.wait(30)
    description = c.describe()
    assert "5 events, the last {\"rs\"" in description
    story = [line for line in description.splitlines() if "s ago: " in line]
    assert [line.split("s ago: ")[1] for line in story] == ['{"assigned": [["t", 0]]}', '{"assigned": []}']
    stop_all([c])
