"""bench.pipeline_cpu runs every case end to end through the sans-IO policy chain (a smoke test, so the bench does
not rot; it asserts what each case did, never a timing)."""

from __future__ import annotations

import json

import pytest

from bench import pipeline_cpu
from proxy.wire.fetch_layout import PartitionKey


@pytest.mark.parametrize("version", [12, 16])
def test_every_case_runs(version: int, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        pipeline_cpu.main(["--partitions", "300", "--fetches", "3", "--version", str(version)])
    assert done.value.code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line.get("case") for line in lines[:-1]] == list(pipeline_cpu.CASES)
    assert lines[-1]["summary"] == "pipeline_cpu" and all(lines[-1][case] >= 0 for case in pipeline_cpu.CASES)
    assert lines[-1]["wrong"] == 0 and all(line["wrong"] == 0 for line in lines[:-1]) and lines[-1]["correct"]


def test_compare_times_both_sides_fetch_by_fetch(capsys: pytest.CaptureFixture[str]) -> None:
    """``--compare REV --cases``: every round, each case on both sides (REV's code extracted, this tree's), one
    line per side and round, and a summary of those cases only, each side's replies checked."""
    with pytest.raises(SystemExit) as done:
        pipeline_cpu.main(["--compare", "HEAD", "--partitions", "300", "--fetches", "4", "--rounds", "2",
                           "--cases", "terminate_sessionless"])
    assert done.value.code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = [(line["round"], line["case"], line["side"]) for line in lines[:-1]]
    assert sorted(runs) == [(r, "terminate_sessionless", side) for r in (0, 1) for side in ("after", "before")]
    assert all(line["wrong"] == 0 and line["ms_per_fetch"] > 0 for line in lines[:-1])
    out = lines[-1]
    assert out["summary"] == "pipeline_cpu_compare" and out["rounds"] == 2 and out["wrong"] == 0 and out["correct"]
    assert set(out["ratio"]) == set(out["before"]) == set(out["after"]) == {"terminate_sessionless"}
    assert set(out["goals"]) == {"ratio.terminate_sessionless"}
    low, high = out["ratio_range"]["terminate_sessionless"]
    assert low <= out["ratio"]["terminate_sessionless"] <= high


def test_cases_and_rounds_are_checked() -> None:
    for argv in (["--cases", "relay,nonesuch"], ["--compare", "HEAD", "--rounds", "0"]):
        with pytest.raises(SystemExit) as refused:
            pipeline_cpu.main(argv)
        assert refused.value.code == 2


def test_the_check_finds_a_wrong_reply() -> None:
    """The summary's "wrong": 0 means something: a reply missing a partition's news, listing a partition never
    asked for, with another correlation id, or partial for a session-less client is each found."""
    keys: list[PartitionKey] = [("t", i) for i in range(5)]
    request = pipeline_cpu.request_frame(12, 7, dict.fromkeys(keys, 0), pipeline_cpu.LEGACY)
    upstream = pipeline_cpu.response_frame(12, 7, keys[:2], 3, 0)

    def reply(corr: int, listed: list[PartitionKey], hw: int = 3) -> bytes:
        return b"\0\0\0\0" + pipeline_cpu.response_frame(12, corr, listed, hw, 0)

    assert pipeline_cpu.check("size_limit", 12, request, upstream, reply(7, keys[:2])) is None
    assert pipeline_cpu.check("terminate_sessionless", 12, request, upstream, reply(7, keys)) is None
    assert pipeline_cpu.check("size_limit", 12, request, upstream, reply(8, keys[:2])) == "correlation id 8"
    assert pipeline_cpu.check("size_limit", 12, request, upstream, reply(7, keys[:1])) == \
        "a partition's news is missing"
    assert pipeline_cpu.check("size_limit", 12, request, upstream, reply(7, keys[:2], hw=2)) == \
        "a partition's news is missing"
    assert pipeline_cpu.check("size_limit", 12, request, upstream, reply(7, [("x", 1), *keys[:2]])) == \
        "a partition the request did not ask for"
    assert pipeline_cpu.check("terminate_sessionless", 12, request, upstream, reply(7, keys[:2])) == \
        "2 of 5 partitions in a session-less client's response"
    assert pipeline_cpu.check("relay", 12, request, upstream, b"") is None
    assert pipeline_cpu.check("relay", 12, request, upstream, reply(7, keys[:2])) == "the response was opened"
    produce, answer = pipeline_cpu._produce_frames(3)
    sized_answer = len(answer).to_bytes(4, "big") + answer
    assert pipeline_cpu.check("produce", 10, produce, answer, sized_answer) is None
    assert pipeline_cpu.check("produce", 10, produce, answer, sized_answer[:-1] + b"\1") == \
        "the reply differs from the broker's"


@pytest.mark.parametrize("case, incremental_upstream, incremental_downstream",
                         [("terminate_sessionless", 3, 0), ("terminate_session", 3, 3)])
def test_terminate_cases_go_upstream_incrementally(case: str, incremental_upstream: int,
                                                   incremental_downstream: int) -> None:
    """3 fetches after the warm-up went upstream in Sluice's own session; the session client's were its own
    incremental fetches too."""
    pl, conn, metrics = pipeline_cpu.chain(case)
    keys: list[PartitionKey] = [("t", i) for i in range(20)]
    frame = pipeline_cpu.request_frame(12, 1, dict.fromkeys(keys, 0), pipeline_cpu.FetchMetadata(0, 0)
                                       if case == "terminate_session" else pipeline_cpu.LEGACY)
    reply = pipeline_cpu._fetch(pl, conn, frame, pipeline_cpu.response_frame(12, 1, keys, 0, 77))
    sid = pipeline_cpu.decode_frame(reply[4:], 12)[2].session_id
    for i in range(3):
        if case == "terminate_session":
            frame = pipeline_cpu.request_frame(12, i + 2, dict.fromkeys(keys[:1], i),
                                               pipeline_cpu.FetchMetadata(sid, i + 1))
        else:
            frame = pipeline_cpu.request_frame(12, i + 2, dict.fromkeys(keys, 0) | dict.fromkeys(keys[:1], i),
                                               pipeline_cpu.LEGACY)
        pipeline_cpu._fetch(pl, conn, frame, pipeline_cpu.response_frame(12, i + 2, keys[:1], i + 1, 77))
    assert metrics.total("sluice_upstream_fetch_requests_total", kind="incremental") == incremental_upstream
    assert metrics.total("sluice_downstream_fetch_requests_total", kind="incremental") == incremental_downstream


def test_opcodes_counts_sluices_code_and_places_the_writes(capsys: pytest.CaptureFixture[str]) -> None:
    """``--opcodes`` counts the round trip's bytecodes in Sluice's own code (the harness's frames left out), with
    the two writes inside the count, and checks the client's reply like the timed case."""
    with pytest.raises(SystemExit) as done:
        pipeline_cpu.main(["--opcodes"])
    assert done.value.code == 0
    line, summary = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert line["bench"] == "pipeline_opcodes" and line["wrong"] == 0
    assert summary["summary"] == "pipeline_opcodes" and summary["opcodes"] == line["opcodes"] and summary["correct"]
    assert 0 < line["before_request_write"] < line["before_request_write"] + line["before_response_write"] \
        < line["opcodes"]
    places = {where for _, _, where in line["top"]}
    # a Produce of a version seen before is read by the chain's shortest path (Chain.relay), not classify
    assert {"connection.py:client_data", "connection.py:upstream_data", "chain.py:relay"} <= places
    assert not any(where.startswith(("pipeline_cpu.py", "core_rig.py")) for where in places)


def test_opcodes_fetch_all_counts_a_fetch_with_every_policy_on(capsys: pytest.CaptureFixture[str]) -> None:
    """``--opcodes --case fetch_all``: a Fetch with records through the core under every policy (the size limit
    and the throttle read its batches: one walk, which the size limit reuses), its reply checked; versions with
    topic ids are refused, not miscounted."""
    with pytest.raises(SystemExit) as done:
        pipeline_cpu.main(["--opcodes", "--case", "fetch_all"])
    assert done.value.code == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["case"] == "fetch_all" and line["wrong"] == 0
    walks = [calls for _, calls, where in line["top"] if where == "records.py:prefix_within"]
    assert walks == [3]  # one walk of each of the 3 partitions, not one per policy
    with pytest.raises(SystemExit) as refused:
        pipeline_cpu.main(["--opcodes", "--case", "fetch_all", "--version", "13"])
    assert refused.value.code == 2


def test_the_fetch_all_check_finds_changed_records() -> None:
    (request, upstream), = pipeline_cpu._fetch_all_frames(12, 1)
    same = b"\0\0\0\0" + upstream
    assert pipeline_cpu.check("fetch_all", 12, request, upstream, same) is None
    keys: list[PartitionKey] = [("bench", i) for i in range(pipeline_cpu.FETCH_ALL_SHAPE[0])]
    changed = b"\0\0\0\0" + pipeline_cpu.response_frame(12, 1, keys, pipeline_cpu.FETCH_ALL_SHAPE[1] * 16, 77, b"")
    assert pipeline_cpu.check("fetch_all", 12, request, upstream, changed) == "the records differ from the broker's"
