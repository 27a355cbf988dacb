"""MetadataAnswers (proxy/policies/addresses.py): a Metadata response rewritten bytes in, bytes out (the core's
shortest path, Relay.rewrite), the answer to the same bytes remembered. Sans-IO: frames in, frames out, a Router."""

from __future__ import annotations

import pytest

from proxy.core.routing import Router
from proxy.policies import addresses
from proxy.policies.addresses import MetadataAnswers
from proxy.wire.api_keys import ApiKey
from proxy.wire.errors import CodecError
from proxy.wire.messages import decode_response, encode_response, response_codec
from proxy.wire.model import Message
from proxy.wire.views import MetadataHead

METADATA = ApiKey.METADATA


def metadata(corr: int, version: int = 12, brokers: tuple[tuple[int, str, int], ...] = ((1, "10.0.0.1", 9092),),
             topics: int = 1) -> bytes:
    """A Metadata response frame (after its size prefix): ``brokers`` (id, host, port), ``topics`` topics."""
    partition = Message(error_code=0, partition_index=0, leader_id=1, leader_epoch=0, replica_nodes=[1],
                        isr_nodes=[1], offline_replicas=[])
    body = response_codec(METADATA, version).default().replace(
        brokers=[Message(node_id=n, host=h, port=p, rack=None) for n, h, p in brokers],
        topics=[Message(error_code=0, name=f"topic-{i}", topic_id=bytes(16), is_internal=False,
                        partitions=[partition], topic_authorized_operations=-2147483648) for i in range(topics)])
    return encode_response(METADATA, version, Message(correlation_id=corr), body)


def router() -> Router:
    return Router("proxy.example", 20000)


def by_the_exchange_path(version: int, frame: bytes, rt: Router) -> bytes:
    """What the chain's path makes of it (Addresses.on_response on a MetadataHead, then its encoding)."""
    view = MetadataHead(version, frame)
    rt.rewrite_metadata(view.head)
    view.changed = True
    buffers, _ = view.encode()
    return b"".join(bytes(b) for b in buffers[1:])


@pytest.mark.parametrize("version", [4, 9, 12, 13])
def test_the_answer_is_the_exchange_paths_and_the_same_bytes_again_come_from_the_memo(version: int) -> None:
    answers = MetadataAnswers(router())
    first = metadata(1, version, brokers=((1, "10.0.0.1", 9092), (2, "10.0.0.2", 9093)), topics=2)
    answer = answers.rewrite(version, first)
    assert answer == by_the_exchange_path(version, first, router())
    brokers = decode_response(METADATA, version, answer)[1].brokers
    assert [(b.node_id, b.host, b.port) for b in brokers] == [(1, "proxy.example", 20001), (2, "proxy.example", 20002)]
    # the same response to another request (its own correlation id): the memo's answer, with that id
    again = answers.rewrite(version, metadata(7, version, brokers=((1, "10.0.0.1", 9092), (2, "10.0.0.2", 9093)),
                                              topics=2))
    assert again[:4] == (7).to_bytes(4, "big") and again[4:] == answer[4:]
    assert len(answers._memo) == 1


def test_the_latest_response_teaches_the_router_even_when_answered_from_the_memo() -> None:
    rt = router()
    answers = MetadataAnswers(rt)
    at_first, moved = metadata(1), metadata(2, brokers=((1, "10.0.0.9", 9092),))
    answers.rewrite(12, at_first)
    assert rt.upstream[1] == ("10.0.0.1", 9092)
    answers.rewrite(12, moved)
    assert rt.upstream[1] == ("10.0.0.9", 9092)
    rt.upstream.clear()
    answers.rewrite(12, metadata(3))  # the first bytes again: the broker moved back
    assert rt.upstream[1] == ("10.0.0.1", 9092)


def test_large_responses_are_rewritten_every_time_and_the_memo_starts_again_when_full(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = MetadataAnswers(router())
    small = metadata(1)
    monkeypatch.setattr(addresses, "METADATA_MEMO_MAX_BYTES", len(small) - 4 - 1)
    assert answers.rewrite(12, small) == by_the_exchange_path(12, small, router())
    assert answers._memo == {}
    monkeypatch.setattr(addresses, "METADATA_MEMO_MAX_BYTES", len(small) - 4)  # its bytes after the correlation id
    answers.rewrite(12, small)
    assert len(answers._memo) == 1
    answers._memo.clear()
    monkeypatch.setattr(addresses, "METADATA_MEMO_MAX_BYTES", 1 << 20)
    monkeypatch.setattr(addresses, "METADATA_MEMO_ENTRIES", 2)
    for topics in (1, 2):
        answers.rewrite(12, metadata(1, topics=topics))
    assert len(answers._memo) == 2
    answers.rewrite(12, metadata(1, topics=3))
    assert len(answers._memo) == 1  # started again: at most METADATA_MEMO_ENTRIES kept


def test_a_malformed_response_raises_the_codec_error_and_is_not_kept() -> None:
    answers = MetadataAnswers(router())
    with pytest.raises(CodecError):
        answers.rewrite(12, metadata(1)[:12])
    assert answers._memo == {}
