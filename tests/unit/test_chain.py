"""The policy chain, sans-IO: address rewriting, ApiVersions, acks=0, bad frames, what is decoded and when."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.accesslog import AccessLog
from proxy.core.chain import Chain, ChainConnection
from proxy.core.exchange import ConnectionInfo, Exchange, Rejected, Relay, Relayed
from proxy.core.policy import Policy, reads
from proxy.core.routing import Router
from proxy.core.topic_names import TopicNames
from proxy.metrics import Metrics
from proxy.wire.fetch_layout import PartitionKey
from proxy.wire.messages import (
    decode_response,
    encode_request,
    encode_response,
    request_codec,
    response_codec,
)
from proxy.wire.model import Message
from proxy.wire.versions import UNSUPPORTED_VERSION
from rig.chain_rig import Clock, SansIOProxy
from tests.support.legacy_produce import produce_v0_2_frame


def proxy() -> SansIOProxy:
    return SansIOProxy(router=Router("proxy.example", 20000))


def req_frame(api_key: int, version: int, body: Message | None = None, corr: int = 7) -> bytes:
    header = Message(request_api_key=api_key, request_api_version=version, correlation_id=corr, client_id="t")
    return encode_request(header, body if body is not None else request_codec(api_key, version).default())


def respond(p: SansIOProxy, frame: bytes, body: Message) -> Message:
    ex = p.request(frame)
    assert ex.collect
    key, version = ex.header.api_key, ex.header.api_version
    raw = encode_response(key, version, Message(correlation_id=ex.header.correlation_id), body)
    sent = p.respond(ex, raw)
    assert int.from_bytes(sent[:4], "big") == len(sent) - 4 == ex.client_bytes - 4
    return decode_response(key, version, sent[4:])[1]


@pytest.mark.parametrize("version", [0, 1, 9, 12, 13])
def test_metadata_brokers_get_advertised_addresses(version: int) -> None:
    p = proxy()
    body = response_codec(3, version).default()
    body.brokers = [
        Message(node_id=1, host="10.0.0.1", port=9092, **({"rack": None} if version >= 1 else {})),
        Message(node_id=2, host="10.0.0.2", port=9093, **({"rack": None} if version >= 1 else {})),
    ]
    out = respond(p, req_frame(3, version), body)
    assert [(b.node_id, b.host, b.port) for b in out.brokers] == [
        (1, "proxy.example", 20001), (2, "proxy.example", 20002)]
    assert p.router.upstream == {1: ("10.0.0.1", 9092), 2: ("10.0.0.2", 9093)}


@pytest.mark.parametrize("version", [0, 3])
def test_find_coordinator_single(version: int) -> None:
    p = proxy()
    body = response_codec(10, version).default().replace(node_id=5, host="broker5", port=9099)
    out = respond(p, req_frame(10, version), body)
    assert (out.node_id, out.host, out.port) == (5, "proxy.example", 20005)


def test_find_coordinator_batched_keeps_error_placeholders() -> None:
    p = proxy()
    body = response_codec(10, 4).default()
    body.coordinators = [
        Message(key="g1", node_id=3, host="b3", port=9092, error_code=0, error_message=None),
        Message(key="g2", node_id=-1, host="", port=-1, error_code=15, error_message="not available"),
    ]
    out = respond(p, req_frame(10, 4), body)
    assert [(c.node_id, c.host, c.port) for c in out.coordinators] == [
        (3, "proxy.example", 20003), (-1, "", -1)]


def test_describe_cluster_brokers_rewritten_controllers_not() -> None:
    p = proxy()
    body = response_codec(60, 1).default()
    body.brokers = [Message(broker_id=1, host="b1", port=9092, rack=None)]
    assert respond(p, req_frame(60, 1), body).brokers[0].port == 20001
    body.endpoint_type = 2
    assert respond(p, req_frame(60, 1), body).brokers[0].port == 9092


def test_fetch_node_endpoints_rewritten_from_v16() -> None:
    p = proxy()
    body = response_codec(1, 16).default()
    body.node_endpoints = [Message(node_id=2, host="broker-two.internal", port=9092, rack=None)]
    raw = encode_response(1, 16, Message(correlation_id=7), body)
    ex = p.request(req_frame(1, 16))
    assert not ex.collect and ex.streamer is not None  # streamed through, only the tail held back
    streamer = ex.streamer(len(raw) - 4)
    sent = b"".join(bytes(b) for b in streamer.feed(raw[4:]))
    assert len(sent) == len(raw) - 4  # same length: the size prefix went out first
    out = decode_response(1, 16, raw[:4] + sent)[1]
    assert [(n.node_id, n.host, n.port) for n in out.node_endpoints] == [(2, "proxy.example", 20002)]
    assert streamer.changed
    # Before KIP-951 there is nothing to rewrite: the response is relayed as bytes, the request never decoded.
    ex = p.request(req_frame(1, 15))
    assert not ex.collect and ex.streamer is None and ex.view is None


def test_api_versions_intersected_and_withheld() -> None:
    p = proxy()
    body = response_codec(18, 3).default()
    body.api_keys = [
        Message(api_key=1, min_version=0, max_version=99),  # Fetch: Sluice decodes 4..18
        Message(api_key=32, min_version=0, max_version=99),  # DescribeConfigs: not decoded, passes through
        Message(api_key=78, min_version=1, max_version=2),  # ShareFetch: decoded (KIP-932)
        Message(api_key=3, min_version=90, max_version=99),  # Metadata: no version in common -> withheld
    ]
    request = Message(client_software_name="t", client_software_version="1")
    out = respond(p, req_frame(18, 3, request), body)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in out.api_keys}
    assert ranges == {1: (4, 18), 32: (0, 99), 78: (1, 2)}
    assert p.metrics.total("sluice_api_withheld_total", api="Metadata") == 1
    # the same broker answer again (another connection, another correlation id): the remembered answer, under
    # this request's correlation id, counted again
    ex = p.request(req_frame(18, 3, request, corr=8))
    sent = p.respond(ex, encode_response(18, 3, Message(correlation_id=8), body))
    header, again = decode_response(18, 3, sent[4:])
    assert header.correlation_id == 8 and again == out and len(sent) == ex.client_bytes
    assert p.metrics.total("sluice_api_withheld_total", api="Metadata") == 2
    # another answer of the broker's is capped afresh
    body.api_keys = body.api_keys[:1]
    assert [(k.api_key, k.min_version, k.max_version) for k in respond(p, req_frame(18, 3, request), body).api_keys] \
        == [(1, 4, 18)]


@pytest.mark.parametrize("version", [0, 2, 3, 4])
def test_api_versions_head_remembered_rest_relayed(version: int) -> None:
    """A KRaft broker's ApiVersions answers differ after ApiKeys (ThrottleTimeMs; FinalizedFeaturesEpoch, its
    metadata log's offset, KIP-584): the capped ApiKeys are remembered once, each answer's own rest reaches the
    client."""
    p = proxy()
    request = Message(client_software_name="t", client_software_version="1") if version >= 3 else None
    body = response_codec(18, version).default()
    body.api_keys = [Message(api_key=1, min_version=0, max_version=99), Message(api_key=32, min_version=0,
                                                                                max_version=99)]
    outs = []
    for epoch in (41, 42):
        if version >= 1:
            body.throttle_time_ms = epoch
        if version >= 3:
            body.finalized_features_epoch = epoch
            body.supported_features = [Message(name="metadata.version", min_version=1, max_version=epoch)]
        outs.append(respond(p, req_frame(18, version, request), body))
    for epoch, out in zip((41, 42), outs, strict=True):
        assert [(k.api_key, k.min_version, k.max_version) for k in out.api_keys] == [(1, 4, 18), (32, 0, 99)]
        if version >= 1:
            assert out.throttle_time_ms == epoch
        if version >= 3:
            assert out.finalized_features_epoch == epoch
            assert [(f.name, f.max_version) for f in out.supported_features] == [("metadata.version", epoch)]
    assert len(p.policy("api_versions")._memo) == 1  # the second answer's head was the first's: not decoded again


def test_share_fetch_node_endpoints_rewritten() -> None:
    """KIP-932: a ShareFetch answered NOT_LEADER_OR_FOLLOWER names the new leader's address in NodeEndpoints."""
    p = proxy()
    for version in (1, 2):
        body = response_codec(78, version).default()
        body.node_endpoints = [Message(node_id=2, host="10.0.0.2", port=9092, rack=None)]
        out = respond(p, req_frame(78, version, request_codec(78, version).default().replace(group_id="g")), body)
        assert [(n.node_id, n.host, n.port) for n in out.node_endpoints] == [(2, "proxy.example", 20002)]


def test_unknown_api_versions_version_answered_locally_like_kafka() -> None:
    p = proxy()
    frame = bytes.fromhex("0012 0063 00000009 0001 74".replace(" ", ""))  # ApiVersions v99, corr 9
    ex = p.request(frame)
    assert ex.answer is not None and not ex.collect
    resp = ex.answer[4:]
    header, body = decode_response(18, 0, resp)
    assert header.correlation_id == 9 and body.error_code == UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(18, 0, 4)]


@pytest.mark.parametrize("version", [3, 8, 9, 12])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_acks_zero_expects_no_response(version: int, acks: int) -> None:
    body = request_codec(0, version).default().replace(transactional_id="txn-1", acks=acks)
    ex = proxy().request(req_frame(0, version, body))
    assert ex.expects_response is (acks != 0)


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_versions_0_to_2_are_relayed(version: int, acks: int) -> None:
    # Advertised by Kafka 4.x (KAFKA-18659) but refused by it: Sluice relays them as bytes for the broker to
    # answer, reading Acks where v0-2 have it (first) so it waits for the answer unless acks=0.
    ex = proxy().request(produce_v0_2_frame(version, acks))
    assert (ex.answer, ex.collect, ex.streamer) == (None, False, None)
    assert ex.expects_response is (acks != 0)


def test_decoded_api_outside_sluice_range_is_rejected() -> None:
    with pytest.raises(Rejected) as e:
        proxy().request(bytes.fromhex("0003 0063 00000001 ffff".replace(" ", "")))
    assert e.value.reason == "unsupported_version"


@pytest.mark.parametrize("frame", [b"", b"\x00\x03", b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x09ab"])
def test_malformed_request_headers(frame: bytes) -> None:
    with pytest.raises(Rejected) as e:
        proxy().request(frame)
    assert e.value.reason == "malformed"


@pytest.mark.parametrize("api_key", [-1, 1000, 32767])
def test_an_api_key_kafka_does_not_define_is_rejected(api_key: int) -> None:
    frame = api_key.to_bytes(2, "big", signed=True) + bytes.fromhex("0000 00000001 ffff".replace(" ", ""))
    with pytest.raises(Rejected) as e:
        proxy().request(frame)
    assert e.value.reason == "unknown_api"


def test_apis_no_policy_declares_are_relayed_without_decoding() -> None:
    """ListOffsets (no policy declares it): not decoded, no policy consulted, the response relayed as bytes."""
    p = proxy()
    ex = p.request(req_frame(2, 7))
    assert ex.policies == () and ex.view is None and not ex.collect and ex.streamer is None


class _Leaves(Policy):
    """Declares one API (Produce unless told); says what Policy.unread is told to for every version."""

    name = "leaves"

    def __init__(self, unread: bool | Relay, api_key: int = 0) -> None:
        self.apis = reads(api_key)
        self._unread = unread

    def unread(self, api_key: int, version: int) -> bool | Relay:
        return self._unread


def _skim(frame: bytes | bytearray | memoryview) -> bool:
    return True


def _walker(size: int) -> Any:
    return None


SKIM, WALK = Relay(check=_skim), Relay(streamer=_walker)


@pytest.mark.parametrize(("declared", "relayed", "terms"), [
    ((True,), True, (None, None)),  # no policy acts on it
    ((True, SKIM), True, (_skim, None)),  # one reads the response, and only when its check is false
    ((WALK, True), True, (None, _walker)),  # one walks the response as it streams
    ((SKIM, True, WALK), False, None),  # two read the response: it is the chain's
    ((True, False), False, None),  # one reads every request
])
def test_a_request_is_relayed_only_when_every_policy_leaves_it_alone(
        declared: tuple[bool | Relay, ...], relayed: bool, terms: object) -> None:
    policies = [_Leaves(d) for d in declared]
    chain = Chain(policies, Metrics(), TopicNames(Clock()))
    info = ConnectionInfo(1, "bootstrap")
    frame = req_frame(0, 9, request_codec(0, 9).default().replace(acks=-1))
    ex = chain.classify(frame, 0.0, info, True)
    assert isinstance(ex, Relayed) is relayed
    if isinstance(ex, Relayed):
        assert ((ex.check, ex.streamer), ex.expects_response, ex.frame, ex.header.correlation_id) == (
            terms, True, frame, 7)
        assert ex.readers == tuple(p for p in policies if isinstance(p._unread, Relay))
    assert isinstance(chain.classify(frame, 0.0, info), Exchange)  # not while another request waits ahead


class _Chooses(_Leaves):
    """Reads every request (unread: False) it applies to, and applies to those whose correlation id is odd."""

    name = "chooses"

    def __init__(self) -> None:
        super().__init__(False)

    def applies(self, ex: Exchange) -> bool:
        return ex.header.correlation_id % 2 == 1


def test_a_request_no_choosing_policy_applies_to_is_relayed_as_the_others_leave_it() -> None:
    """A policy that chooses its requests (``applies``) and reads those: the ones it does not choose are relayed
    on the route of the policies left (a consumer's fetch cooperative consumption does not filter)."""
    chooses, skims = _Chooses(), _Leaves(SKIM)
    chain = Chain([chooses, skims], Metrics(), TopicNames(Clock()))
    info = ConnectionInfo(1, "bootstrap")
    body = request_codec(0, 9).default().replace(acks=-1)
    chosen, left = req_frame(0, 9, body, corr=7), req_frame(0, 9, body, corr=8)
    ex = chain.classify(chosen, 0.0, info, True)
    assert isinstance(ex, Exchange) and ex.policies == (chooses, skims)
    relayed = chain.classify(left, 0.0, info, True)
    assert isinstance(relayed, Relayed)
    assert (relayed.check, relayed.streamer, relayed.readers, relayed.frame) == (_skim, None, (skims,), left)
    waiting = chain.classify(left, 0.0, info)  # not while another request waits ahead
    assert isinstance(waiting, Exchange) and waiting.policies == (skims,)


def test_a_version_outside_what_the_policies_read_is_refused_not_relayed() -> None:
    chain = Chain([_Leaves(True, api_key=3)], Metrics(), TopicNames(Clock()))
    with pytest.raises(Rejected) as e:
        chain.classify(bytes.fromhex("0003 0063 00000001 ffff".replace(" ", "")), 0.0, None, True)
    assert e.value.reason == "unsupported_version"


@pytest.mark.parametrize("api_key, version", [(0, 10), (0, 13)])
def test_produce_without_node_endpoints_relays_the_upstream_bytes(api_key: int, version: int) -> None:
    p = proxy()
    ex = p.request(req_frame(api_key, version))
    assert ex.collect  # KIP-951 versions are inspected...
    body = response_codec(api_key, version).default()
    raw = encode_response(api_key, version, Message(correlation_id=7), body)
    p.respond(ex, raw)
    assert ex.reply is not None and ex.reply[1] is raw  # ...but relayed as the same bytes when nothing changes
    assert p.metrics.total("sluice_responses_rewritten_total") == 0


def test_produce_node_endpoints_rewritten() -> None:
    p = proxy()
    body = response_codec(0, 12).default()
    body.node_endpoints = [Message(node_id=4, host="b4", port=9092, rack="r1")]
    out = respond(p, req_frame(0, 12, request_codec(0, 12).default().replace(acks=1)), body)
    assert [(n.node_id, n.host, n.port, n.rack) for n in out.node_endpoints] == [(4, "proxy.example", 20004, "r1")]


@pytest.mark.parametrize("version", [0, 4, 9, 12, 13])
def test_metadata_topics_relayed_as_bytes_brokers_rewritten(version: int) -> None:
    """Only Metadata's head (up to Brokers) is decoded; the topics after it go out exactly as received."""
    p = proxy()
    codec = response_codec(3, version)
    body = codec.default()
    rack = {"rack": "r1"} if version >= 1 else {}
    body.brokers = [Message(node_id=2, host="10.1.1.2", port=9093, **rack)]
    topic = Message(error_code=0, name="t", **({"is_internal": False} if version >= 1 else {}))
    if version >= 10:
        topic.topic_id = bytes(range(16))
    topic.partitions = [Message(error_code=0, partition_index=0, leader_id=2, replica_nodes=[2], isr_nodes=[2],
                                **({"leader_epoch": 5} if version >= 7 else {}),
                                **({"offline_replicas": []} if version >= 5 else {}))]
    if version >= 8:
        topic.topic_authorized_operations = -2147483648
    body.topics = [topic]
    raw = encode_response(3, version, Message(correlation_id=7), body)
    out = respond(p, req_frame(3, version), body)
    assert [(b.node_id, b.host, b.port) for b in out.brokers] == [(2, "proxy.example", 20002)]
    assert out.topics == decode_response(3, version, raw)[1].topics


def test_access_log_partitions_include_those_without_bytes() -> None:
    """The access log's per-partition bytes list every partition of a decoded Fetch response, idle ones with 0:
    the analytics count empty fetches and partitions without bytes from them (that is how starvation shows)."""
    import io

    from bench.pipeline_cpu import request_frame, response_frame
    from proxy.accesslog import AccessLog
    from proxy.policies.terminate.sessions import LEGACY

    keys: list[PartitionKey] = [("t", i) for i in range(5)]
    p = SansIOProxy({"sessions.mode": "terminate"}, access_log=AccessLog(io.StringIO()))
    ex = p.request(request_frame(12, 1, dict.fromkeys(keys, 0), LEGACY))
    p.respond(ex, response_frame(12, 1, keys, 0, 77))
    assert ex.partitions == [("t", i, 0) for i in range(5)]


@pytest.mark.parametrize("version", [12, 16])
def test_access_log_lists_an_assembled_response_from_its_keys(version: int) -> None:
    """A session-less client's full response that terminate mode assembles from kept encodings is listed from the
    keys it was built from (no row per partition), as its decoded partitions read: each topic by its name, and
    the partitions with records with their bytes."""
    import io

    from bench.pipeline_cpu import TOPIC_ID, decode_frame, one_record_batch, request_frame, response_frame
    from proxy.accesslog import KeptListing
    from proxy.policies.terminate.sessions import LEGACY

    topic: str | bytes = TOPIC_ID if version >= 13 else "t"
    keys: list[PartitionKey] = [(topic, i) for i in range(6)]
    p = SansIOProxy({"sessions.mode": "terminate"}, access_log=AccessLog(io.StringIO()))
    p.names.learn(TOPIC_ID, "t")
    listed = []
    for corr in range(1, 5):
        ex = p.request(request_frame(version, corr, dict.fromkeys(keys, corr - 1), LEGACY))
        busy = keys if corr == 1 else keys[corr % 3:corr % 3 + 2]
        reply = p.respond(ex, response_frame(version, corr, busy, corr, 77, one_record_batch()))
        view = decode_frame(reply[4:], version)[2]
        assert ex.partitions is not None
        rows = ex.partitions.rows() if isinstance(ex.partitions, KeptListing) else ex.partitions
        assert rows == [("t", q.partition_index, q.records_size) for t in view.topics for q in t.partitions]
        assert sum(size for *_, size in rows) == len(busy) * len(one_record_batch())
        listed.append(type(ex.partitions))
    assert listed[-1] is KeptListing  # (the client asked for the same partitions again)


def test_access_log_partitions_are_not_gathered_when_the_access_log_is_off() -> None:
    from bench.pipeline_cpu import request_frame, response_frame
    from proxy.policies.terminate.sessions import LEGACY

    keys: list[PartitionKey] = [("t", i) for i in range(5)]
    p = SansIOProxy({"sessions.mode": "terminate"})
    ex = p.request(request_frame(12, 1, dict.fromkeys(keys, 0), LEGACY))
    p.respond(ex, response_frame(12, 1, keys, 0, 77))
    assert "partitions" not in ex.log


@pytest.mark.parametrize("version", [13, 17])
def test_fetch_by_topic_id_waits_for_names_when_the_access_log_lists_them(version: int) -> None:
    """A Fetch v13+ names topics by id only; a policy that decodes its response (here a size budget) makes the
    access log list its partitions, by topic name, so with the access log on the request waits for the names of
    its ids (the server looks them up). With the access log off, or no such policy, nothing waits."""
    import io

    from proxy.accesslog import AccessLog

    tid = bytes(range(1, 17))
    body = request_codec(1, version).default().replace(
        max_wait_ms=0, min_bytes=1, topics=[Message(topic_id=tid, partitions=[
            Message(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=1 << 20)])], forgotten_topics_data=[])
    frame = req_frame(1, version, body)
    budget = {"size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": 1 << 20}]}
    logged = SansIOProxy(budget, access_log=AccessLog(io.StringIO()))
    assert logged.chain.classify(frame, 0.0).missing_names == {tid}
    assert not SansIOProxy(budget).chain.classify(frame, 0.0).missing_names
    assert not SansIOProxy(access_log=AccessLog(io.StringIO())).chain.classify(frame, 0.0).missing_names
    logged.names.learn(tid, "topic")
    assert not logged.chain.classify(frame, 0.0).missing_names
    ex = logged.request(frame)
    assert ex.collect  # the budget decodes the response: its access-log line names "topic"


def test_reconfiguration_is_all_or_nothing() -> None:
    """A policy whose new section cannot be made ready leaves every policy as it was, those before it included;
    once every one is ready, all apply."""

    class Setting(Policy):
        def __init__(self) -> None:
            self.value = "old"

        def reconfigure(self, section: Any) -> Any:
            if section == "bad":
                raise ValueError("cannot be made ready")
            return lambda: setattr(self, "value", section)

    first, second = Setting(), Setting()
    chain = Chain([first, second], Metrics(), TopicNames(Clock()), AccessLog("off"))
    with pytest.raises(ValueError):
        chain.reconfigure({first: "new", second: "bad"})
    assert (first.value, second.value) == ("old", "old")
    chain.reconfigure({first: "new", second: "newer"})
    assert (first.value, second.value) == ("new", "newer")


class _Hop(Policy):
    """Sees every ListOffsets request and response, noting the frames it is handed and the states it made; the one
    that asks (``again``) sends ``again`` upstream instead of its first response; one that answers on its second
    request answers ``answer``."""

    name = "hop"

    def __init__(self, again: bytes | None = None, answer: bytes | None = None) -> None:
        self.apis = reads(2)
        self.again, self.answer = again, answer
        self.requests: list[bytes] = []
        self.responses: list[int] = []

    def on_request(self, ex: Exchange, state: Any) -> Any:
        self.requests.append(ex.frame)
        if self.answer is not None and len(self.requests) == 2:
            ex.answer = self.answer
        ex.collect = True
        return len(self.requests)

    def on_response(self, ex: Exchange, response: Any, conn_state: Any, state: Any) -> None:
        self.responses.append(state)
        if self.again is not None and len(self.responses) == 1:
            ex.send_again(self.again)


def _list_offsets(chain: Chain) -> tuple[Exchange, ChainConnection, bytes]:
    conn = chain.connect(ConnectionInfo(1, "bootstrap"))
    ex = chain.classify(req_frame(2, 7), 0.0, conn.info)
    chain.on_request(conn, ex)
    response = encode_response(2, 7, Message(correlation_id=7), response_codec(2, 7).default())
    return ex, conn, response


def test_a_policy_sending_a_request_again_hands_it_to_the_policies_after_it_as_a_new_one() -> None:
    """The resend effect from a policy in the middle of the chain: the policies nearer the broker take the frame it
    put in ex.frame as a new request (their on_request again, their earlier state dropped) and see the next
    response first; the policies nearer the client see one request and one response."""
    again = req_frame(2, 7, corr=7)
    client, asker, broker = _Hop(), _Hop(again=again), _Hop()
    chain = Chain([client, asker, broker], Metrics(), TopicNames(Clock()))
    ex, conn, response = _list_offsets(chain)
    ex.may_resend = True
    chain.on_response(conn, ex, response)
    assert ex.resend and ex.frame == again and ex.view is None
    assert broker.requests[1] is again and ex.states == [1, 1, 2]  # the broker side's new state
    ex.resend = False  # the core sends it (Connection._end_response)
    chain.on_response(conn, ex, response)
    assert not ex.resend and ex.reply is not None
    assert (client.responses, asker.responses, broker.responses) == ([1], [1, 1], [1, 2])
    assert len(client.requests) == len(asker.requests) == 1


def test_an_answer_to_a_request_sent_again_is_the_clients_reply() -> None:
    answer = b"\x00\x00\x00\x04\x00\x00\x00\x07"
    asker, broker = _Hop(again=req_frame(2, 7)), _Hop(answer=answer)
    chain = Chain([asker, broker], Metrics(), TopicNames(Clock()))
    ex, conn, response = _list_offsets(chain)
    ex.may_resend = True
    chain.on_response(conn, ex, response)
    assert not ex.resend and ex.answer is None and ex.reply == [answer] and ex.client_bytes == len(answer)
