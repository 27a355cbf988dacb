"""How the connection core writes: a relayed response is one write per read — its header with its
body's first bytes, not an 8-byte write of its own — and requests are framed from the read itself, their bytes
relayed unchanged whichever way they were split."""

from __future__ import annotations

from proxy.wire.messages import request_codec
from rig.core_rig import CoreRig, request, response, sized


def produce(corr: int) -> bytes:
    return request(0, 9, corr, request_codec(0, 9).default().replace(acks=1))


def test_a_response_read_whole_goes_to_the_client_in_one_write() -> None:
    conn, port = CoreRig().connect()
    conn.client_data(sized(produce(1)))
    answer = sized(response(0, 9, 1))
    conn.upstream_data(answer)
    assert port.named("send_client") == [("send_client", answer)]


def test_pipelined_responses_in_one_read_are_one_write_each() -> None:
    conn, port = CoreRig().connect()
    conn.client_data(sized(produce(1), produce(2)))
    answers = [sized(response(0, 9, c)) for c in (1, 2)]
    conn.upstream_data(b"".join(answers))
    assert port.named("send_client") == [("send_client", a) for a in answers]


def test_a_header_split_across_reads_or_ending_a_read_still_reaches_the_client_in_order() -> None:
    conn, port = CoreRig().connect()
    conn.client_data(sized(produce(1), produce(2), produce(3)))
    answers = b"".join(sized(response(0, 9, c)) for c in (1, 2, 3))
    first = len(sized(response(0, 9, 1)))
    # the second header split in two; the third read ends right after a header (its body in the next read)
    cuts = [first + 3, first * 2 + 8]
    for a, b in zip([0, *cuts], [*cuts, len(answers)], strict=True):
        conn.upstream_data(answers[a:b])
    assert port.take_client() == answers
    assert not conn.busy and not conn.closed


def test_requests_split_anywhere_are_relayed_unchanged() -> None:
    frames = sized(produce(1), produce(2), produce(3))
    for step in (1, 3, 7, len(frames) - 1):
        conn, port = CoreRig().connect()
        for i in range(0, len(frames), step):
            conn.client_data(frames[i : i + step])
        assert port.take_upstream() == frames
        assert len(conn.inflight) == 3
