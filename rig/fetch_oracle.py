"""Test oracles for the Fetch fast paths: the bridge between the zero-copy views and Kafka's construct-model
messages, a construct-model Fetch request carrying a session plan, and what a construct-model request or
response says (partitions, forgotten partitions, response keys), read the way Kafka reads it. The session server
and client take only the fast views; :func:`handle_request` / :func:`handle_response` feed them construct
messages for the tests written with those.

Tests (and benches that compare against the reference codec) use these to prove the hand-written fast paths
equal to the construct codec. Production code never imports this module: the proxy reads and writes Fetch with
the fast paths alone.
"""

from __future__ import annotations

import io
from functools import cache
from typing import Any

from proxy.policies.terminate.sessions import (
    Decision,
    SessionClient,
    SessionServer,
    UpstreamPlan,
)
from proxy.wire.api_keys import ApiKey
from proxy.wire.compiler import KafkaStruct, struct_for
from proxy.wire.errors import CodecError
from proxy.wire.fetch_fast import (
    AbortedTransaction,
    Buffer,
    FetchPartition,
    FetchResponseView,
    FetchTopic,
    NodeEndpoint,
    build_tags,
    parse_tags,
)
from proxy.wire.fetch_layout import (
    FIRST_FLEXIBLE,
    FIRST_NODE_ENDPOINTS,
    FIRST_TOPIC_ID,
    NODE_ENDPOINTS_TAG,
    PartitionKey,
)
from proxy.wire.fetch_request_fast import FetchParams, FetchRequestView, check_topic_key, decode_fetch_request
from proxy.wire.messages import encode_request, request_codec, request_spec, response_spec
from proxy.wire.model import Message


def to_message(view: FetchResponseView) -> Message:
    """The same :class:`Message` as ``response_codec(1, version).decode`` returns for the encoded body."""
    return _to_message(view)


def from_message(msg: Message, version: int) -> FetchResponseView:
    """The view of a construct-model Fetch response (records are referenced, not copied)."""
    return _from_message(msg, version)


def request_view(request: Message, version: int) -> FetchRequestView:
    """The fast path's view of a construct-model FetchRequest body (encoded under a request header)."""
    header = Message(request_api_key=int(ApiKey.FETCH), request_api_version=version, correlation_id=0,
                     client_id="oracle")
    return decode_fetch_request(encode_request(header, request))


def handle_request(server: SessionServer, request: Message, version: int, now: float) -> Decision:
    """``server.handle_request`` for a construct-model FetchRequest body (the proxy reads only the fast view)."""
    return server.handle_request(request_view(request, version), version, now)


def handle_response(client: SessionClient, response: Message, version: int) -> bool:
    """``client.handle_response`` for a construct-model FetchResponse body."""
    return client.handle_response(from_message(response, version), version)


def params_of(p: Message) -> FetchParams:
    """FetchParams of a construct-decoded FetchRequest partition (absent fields of older versions take the spec
    defaults; its tag section is not kept: the fast path, which keeps it, is what the proxy reads)."""
    return FetchParams(p.fetch_offset, p.get("log_start_offset", -1), p.partition_max_bytes,
                       p.get("current_leader_epoch", -1), p.get("last_fetched_epoch", -1))


def request_partitions(request: Message, version: int) -> dict[PartitionKey, FetchParams]:
    """A construct-model FetchRequest's partitions in request order (a repeated partition: the last one wins,
    as in Kafka's map): what ``FetchRequestView.partitions`` must give."""
    tf = topic_field(version)
    out: dict[PartitionKey, FetchParams] = {}
    for t in request.topics or ():
        topic = t.get(tf)
        for p in t.partitions or ():
            out[(topic, p.partition)] = params_of(p)
    return out


def forgotten_partitions(request: Message, version: int) -> list[PartitionKey]:
    """A construct-model FetchRequest's forgotten partitions: what ``FetchRequestView.forgotten`` must give."""
    tf = topic_field(version)
    return [(t.get(tf), p) for t in request.get("forgotten_topics_data") or () for p in t.partitions or ()]


def response_keys(response: Message, version: int) -> list[PartitionKey]:
    """The partition keys of a construct-model FetchResponse body, in response order."""
    tf = topic_field(version)
    return [(t.get(tf), p.partition_index) for t in response.responses or () for p in t.partitions or ()]


def build_response(server: SessionServer, decision: Decision, partition_states: Any, throttle_time_ms: int = 0,
                   now: float | None = None) -> Message:
    """``server.build_view`` as a construct-model FetchResponse body."""
    return to_message(server.build_view(decision, partition_states, throttle_time_ms, now))


class _Structs:
    """The construct structs of one Fetch response version, for the tagged fields the fast path keeps raw."""

    def __init__(self, version: int) -> None:
        top = struct_for(response_spec(ApiKey.FETCH), version)
        self.top = top
        self.topic: KafkaStruct = _element(top, "responses")
        self.partition: KafkaStruct = _element(self.topic, "partitions")
        self.aborted: KafkaStruct = _element(self.partition, "aborted_transactions")
        self.endpoint: KafkaStruct | None = (
            top.tagged[NODE_ENDPOINTS_TAG][1].element
            if top.tagged and NODE_ENDPOINTS_TAG in top.tagged else None
        )


def _element(st: KafkaStruct, name: str) -> KafkaStruct:
    for fname, sub, _ in st.plain:
        if fname == name:
            element: KafkaStruct = sub.element
            return element
    raise CodecError(f"{st.struct_name} has no array {name}")  # the specs define them all


def topic_field(version: int) -> str:
    """The construct field naming a Fetch topic: its name up to v12, its id from v13 (FetchRequest.json)."""
    return "topic_id" if version >= FIRST_TOPIC_ID else "topic"


def _absent_value(sub: Any, dflt: Any) -> Any:
    """What the construct codec gives a field absent from the wire: a struct's defaults, an empty array, or
    the spec's default (the public ``KafkaStruct.default``; the codec's own helper is private)."""
    if isinstance(sub, KafkaStruct) and dflt is None:
        return sub.default()
    return [] if isinstance(dflt, list) else dflt


@cache
def _structs(version: int) -> _Structs:
    return _Structs(version)


def _tags_to_fields(st: KafkaStruct, raw: Buffer | None, d: dict[str, Any]) -> None:
    """Fill ``d`` with ``st``'s tagged fields from a raw tag section, like KafkaStruct._parse does."""
    tagged = st.tagged or {}
    for fname, sub, dflt in tagged.values():
        d[fname] = _absent_value(sub, dflt)
    unknown: dict[int, bytes] = {}
    for tag, value in parse_tags(raw).items():
        known = tagged.get(tag)
        if known is None:
            unknown[tag] = bytes(value)
            continue
        stream = io.BytesIO(value)
        try:
            d[known[0]] = known[1]._parse(stream, None, "")
        except CodecError:
            raise
        except Exception as e:  # construct primitives: struct.error, StreamError ...
            raise CodecError(f"tagged field {tag}: {type(e).__name__}: {e}") from None
        if stream.tell() != len(value):
            left = len(value) - stream.tell()
            raise CodecError(f"{st.struct_name}: tagged field {tag} has {left} trailing bytes")
    if unknown:
        d["unknown_tags"] = unknown


def _fields_to_tags(st: KafkaStruct, d: dict[str, Any]) -> bytes | None:
    """The raw tag section for a Message's tagged fields, like KafkaStruct._build writes it."""
    fields: dict[int, Buffer] = {}
    for tag, (fname, sub, dflt) in (st.tagged or {}).items():
        if fname not in d or d[fname] == _absent_value(sub, dflt):
            continue
        buf = io.BytesIO()
        sub._build(d[fname], buf, None, "")
        fields[tag] = buf.getvalue()
    for tag, raw in (d.get("unknown_tags") or {}).items():
        fields[tag] = raw
    return build_tags(fields)


def _to_message(view: FetchResponseView) -> Message:
    v = view.version
    flexible = v >= FIRST_FLEXIBLE
    st = _structs(v) if flexible else None
    responses = []
    for t in view.topics:
        parts = []
        for p in t.partitions:
            d: dict[str, Any] = {
                "partition_index": p.partition_index,
                "error_code": p.error_code,
                "high_watermark": p.high_watermark,
                "last_stable_offset": p.last_stable_offset,
            }
            if v >= 5:
                d["log_start_offset"] = p.log_start_offset
            if p.aborted_transactions is None:
                d["aborted_transactions"] = None
            else:
                aborted = []
                for a in p.aborted_transactions:
                    ad: dict[str, Any] = {"producer_id": a.producer_id, "first_offset": a.first_offset}
                    if st is not None:
                        _tags_to_fields(st.aborted, a.tags, ad)
                    aborted.append(Message(**ad))
                d["aborted_transactions"] = aborted
            if v >= 11:
                d["preferred_read_replica"] = p.preferred_read_replica
            d["records"] = p.records
            if st is not None:
                _tags_to_fields(st.partition, p.tags, d)
            parts.append(Message(**d))
        td: dict[str, Any] = {"topic_id": t.topic_id} if v >= FIRST_TOPIC_ID else {"topic": t.topic}
        td["partitions"] = parts
        if st is not None:
            _tags_to_fields(st.topic, t.tags, td)
        responses.append(Message(**td))
    top: dict[str, Any] = {"throttle_time_ms": view.throttle_time_ms}
    if v >= 7:
        top["error_code"] = view.error_code
        top["session_id"] = view.session_id
    top["responses"] = responses
    if flexible:
        if v >= FIRST_NODE_ENDPOINTS:
            eps = []
            for e in view.node_endpoints:
                ed: dict[str, Any] = {"node_id": e.node_id, "host": e.host, "port": e.port, "rack": e.rack}
                assert st is not None and st.endpoint is not None
                _tags_to_fields(st.endpoint, e.tags, ed)
                eps.append(Message(**ed))
            top["node_endpoints"] = eps
        if view.unknown_tags:
            top["unknown_tags"] = {k: bytes(raw) for k, raw in view.unknown_tags.items()}
    return Message(**top)


def _from_message(msg: Message, version: int) -> FetchResponseView:
    flexible = version >= FIRST_FLEXIBLE
    st = _structs(version) if flexible else None
    top = msg.fields()
    topics = []
    for t in top.get("responses") or []:
        td = t.fields()
        parts = []
        for p in td.get("partitions") or []:
            pd = p.fields()
            aborted = None
            if pd.get("aborted_transactions") is not None:
                aborted = [
                    AbortedTransaction(a.producer_id, a.first_offset,
                                       _fields_to_tags(st.aborted, a.fields()) if st is not None else None)
                    for a in pd["aborted_transactions"]
                ]
            parts.append(FetchPartition(
                pd.get("partition_index", 0),
                pd.get("error_code", 0),
                pd.get("high_watermark", 0),
                pd.get("last_stable_offset", -1),
                pd.get("log_start_offset", -1),
                aborted,
                pd.get("preferred_read_replica", -1),
                pd.get("records"),
                _fields_to_tags(st.partition, pd) if st is not None else None,
            ))
        topics.append(FetchTopic(
            td.get("topic", ""),
            td.get("topic_id", bytes(16)),
            parts,
            _fields_to_tags(st.topic, td) if st is not None else None,
        ))
    endpoints = []
    if version >= FIRST_NODE_ENDPOINTS:
        assert st is not None and st.endpoint is not None
        for e in top.get("node_endpoints") or []:
            endpoints.append(NodeEndpoint(e.node_id, e.host, e.port, e.get("rack"),
                                          _fields_to_tags(st.endpoint, e.fields())))
    unknown = dict(top.get("unknown_tags") or {}) if flexible else {}
    return FetchResponseView(version, top.get("throttle_time_ms", 0), top.get("error_code", 0),
                             top.get("session_id", 0), topics, endpoints, unknown)


def apply_plan(request: Message, version: int, plan: UpstreamPlan) -> Message:
    """A copy of FetchRequest ``request`` (of ``version``) carrying ``plan``: session id and epoch, the
    partitions to send grouped by topic, and the forgotten topics. Other fields are kept."""
    by_id = version >= FIRST_TOPIC_ID
    top = request_codec(1, version).default()
    topic_st, part_st, forgot_st = _request_elements(version)
    tf = topic_field(version)
    # Consecutive partitions of one topic share a topic entry (Java's FetchRequest.Builder): the order of
    # ``to_send`` is kept exactly, since a full request is read in request order under max_bytes.
    topics: list[Message] = []
    last: Any = None
    for (topic, partition), params in plan.to_send.items():
        check_topic_key(topic, by_id)
        if not topics or topic != last:
            topics.append(topic_st.default().replace(**{tf: topic, "partitions": []}))
            last = topic
        entry = topics[-1]
        p = part_st.default()
        fields = {"partition": partition, "fetch_offset": params.fetch_offset,
                  "log_start_offset": params.log_start_offset, "partition_max_bytes": params.partition_max_bytes,
                  "current_leader_epoch": params.current_leader_epoch,
                  "last_fetched_epoch": params.last_fetched_epoch}
        entry.partitions.append(p.replace(**{k: v for k, v in fields.items() if k in p.fields()}))
    forgotten: list[Message] = []
    findex: dict[Any, Message] = {}
    for topic, partition in plan.to_forget:
        check_topic_key(topic, by_id)
        fentry = findex.get(topic)
        if fentry is None:
            fentry = findex[topic] = forgot_st.default().replace(**{tf: topic, "partitions": []})
            forgotten.append(fentry)
        fentry.partitions.append(partition)
    out = request.replace(topics=topics)
    if "session_id" in top.fields():
        out = out.replace(session_id=plan.metadata.session_id, session_epoch=plan.metadata.epoch,
                          forgotten_topics_data=forgotten)
    return out


@cache
def _request_elements(version: int) -> tuple[KafkaStruct, KafkaStruct, KafkaStruct]:
    """The construct structs of a FetchRequest's topic, partition and forgotten-topic entries."""
    top = struct_for(request_spec(1), version)
    topic = _element(top, "topics")
    return topic, _element(topic, "partitions"), _element(top, "forgotten_topics_data")

