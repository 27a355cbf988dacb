"""bench.instructions --cold: the cache misses read from callgrind's output."""

from __future__ import annotations

from pathlib import Path

from bench import instructions
from bench.instructions import cache_misses
from proxy.wire.messages import decode_response, encode_response


def test_cold_misses_are_the_last_level_misses_and_l1_the_first_levels(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    # the header and totals lines as callgrind 3.19 writes them with --cache-sim=yes
    out.write_text("# callgrind format\nversion: 1\nevents: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
                   "fl=(1) x.c\nfn=(1) f\n0 10 4 2 3 2 1 2 1 1\n"
                   "totals: 1000 400 200 30 20 10 7 5 3\n")
    assert cache_misses(out) == (7 + 5 + 3, 30 + 20 + 10)



def test_a_metadata_reply_is_right_only_with_every_broker_at_sluices_one_host() -> None:
    """``--case metadata``'s check (wrong_reply) against the core itself: Sluice's answer passes; the broker's bytes
    relayed as they came (its real addresses: a leak), a broker missing and a cut frame do not."""
    request, response = instructions._metadata_frames(7)
    (reply,) = [b"".join(bytes(b) for b in instructions._core("metadata", None)(
        len(request).to_bytes(4, "big") + request, [len(response).to_bytes(4, "big") + response]))]
    assert not instructions.wrong_reply("metadata", request, response, reply)
    assert instructions.wrong_reply("metadata", request, response, len(response).to_bytes(4, "big") + response)
    assert instructions.wrong_reply("metadata", request, response, reply[:-1])
    header, body = decode_response(3, 12, reply[4:])
    fewer = encode_response(3, 12, header, body.replace(brokers=body.brokers[1:]))
    assert instructions.wrong_reply("metadata", request, response, len(fewer).to_bytes(4, "big") + fewer)
