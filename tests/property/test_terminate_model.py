"""Terminate mode against a model (sans-IO, hypothesis state machines): a client with its own fetch session (and,
in the second machine, a session-less client) talks to Sluice (SessionServer downstream, SessionClient and
partition states upstream, the O(changed) shortcuts) and Sluice to a broker, played by a second SessionServer
over the true partition states (its rules are Kafka's, checked against FetchSession.scala in
tests/unit/test_sessions.py).

Whatever happens in between (produce on any partition, partitions added and forgotten, a session-less fetch on
the same connection, the broker losing Sluice's session, the client starting a new session), after every fetch
the client knows the true high watermark of every partition of its session and has received every record it
asked for: nothing missed, nothing invented. Records are modelled by their offsets: a partition's record set
in a response is the offsets [fetch offset, high watermark) encoded as text, so a stale or wrong answer shows.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from proxy.accesslog import KeptListing
from proxy.policies.terminate.policy import (
    UpstreamSessions,
    build_client_response,
    plan_request,
    plan_session_request,
    replan,
    sessionless_delta,
    set_baseline,
)
from proxy.policies.terminate.sessions import (
    FINAL_EPOCH,
    FetchMetadata,
    FetchParams,
    Kind,
    PartitionKey,
    SessionCache,
    SessionServer,
    UpstreamPlan,
)
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView
from proxy.wire.fetch_request_fast import FetchRequestView, decode_fetch_request
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from rig.fetch_oracle import apply_plan

V = 12
KEYS: list[PartitionKey] = [(topic, i) for topic, n in (("t", 4), ("u", 2)) for i in range(n)]
key_st = st.sampled_from(KEYS)


def request_frame(offsets: dict[PartitionKey, int], session_id: int, epoch: int,
                  forget: list[PartitionKey] | None = None, corr: int = 1) -> bytes:
    body = request_codec(1, V).default().replace(replica_id=-1)
    parts = {k: FetchParams(o) for k, o in offsets.items()}
    body = apply_plan(body, V, UpstreamPlan(FetchMetadata(session_id, epoch), parts, list(forget or []), parts))
    header = Message(request_api_key=1, request_api_version=V, correlation_id=corr, client_id="model")
    return encode_request(header, body)


def request(offsets: dict[PartitionKey, int], session_id: int, epoch: int,
            forget: list[PartitionKey] | None = None) -> FetchRequestView:
    return decode_fetch_request(request_frame(offsets, session_id, epoch, forget))


def records(start: int, end: int) -> bytes:
    return ",".join(map(str, range(start, end))).encode() if end > start else b""


class Broker:
    """The upstream: true high watermarks, and Kafka's session rules (a SessionServer)."""

    def __init__(self) -> None:
        self.hw = dict.fromkeys(KEYS, 0)
        self.server = SessionServer(SessionCache(rng=random.Random(1)))

    def fetch(self, frame: bytes) -> FetchResponseView:
        req = decode_fetch_request(frame)
        decision = self.server.handle_request(req, V, now=0.0)
        states = {k: FetchPartition(k[1], 0, self.hw[k], self.hw[k], 0, None, -1,
                                    records(p.fetch_offset, self.hw[k]))
                  for k, p in decision.partitions.items()}
        return self.server.build_view(decision, states)


class World(RuleBasedStateMachine):
    """What both clients live in: the broker, the connection's upstream side in Sluice, the client's partitions
    (fetch offsets) and the records it received, and the rules that change the world under it."""

    def __init__(self) -> None:
        super().__init__()
        self.broker = Broker()
        self.conn = UpstreamSessions()
        self.wanted: dict[PartitionKey, int] = {KEYS[0]: 0, KEYS[4]: 0}  # fetch offsets of its partitions
        self.received: dict[PartitionKey, list[int]] = {k: [] for k in KEYS}

    @rule(key=key_st, n=st.integers(1, 3))
    def produce(self, key: PartitionKey, n: int) -> None:
        self.broker.hw[key] += n

    @rule(key=key_st)
    def add_partition(self, key: PartitionKey) -> None:
        if key not in self.wanted:
            self.wanted[key] = len(self.received[key])  # resume where it stopped reading

    @precondition(lambda self: len(self.wanted) > 1)
    @rule(data=st.data())
    def forget_partition(self, data: st.DataObject) -> None:
        del self.wanted[data.draw(st.sampled_from(sorted(self.wanted)))]  # told to Sluice with the next fetch

    @rule()
    def broker_loses_sluices_session(self) -> None:
        self.broker.server.cache.sessions.clear()

    @invariant()
    def records_arrive_once_in_order(self) -> None:
        """Every record the client received, per partition: offsets 0, 1, 2, ... (nothing repeated or skipped)."""
        for key, offsets in self.received.items():
            assert offsets == list(range(len(offsets))), f"{key}: {offsets[:20]}"


class TerminateModel(World):
    def __init__(self) -> None:
        super().__init__()
        self.sluice = SessionServer(SessionCache(rng=random.Random(2)))
        self.session = (0, 0)  # the client's (session id, next epoch); (0, 0): create one next
        self.known_hw: dict[PartitionKey, int] = {}
        self.sent: dict[PartitionKey, int] = {}  # what the client's session holds (Java's sessionPartitions)

    @rule()
    def client_starts_a_new_session(self) -> None:
        self.session = (self.session[0], 0)

    @rule()
    def sessionless_fetch_on_the_same_connection(self) -> None:
        """Another (session-less) use of the connection's states: breaks the O(changed) agreement."""
        planned = plan_request(request(dict.fromkeys(KEYS, 0), 0, FINAL_EPOCH), self.conn)
        if planned is not None:
            frame, ticket = planned
            build_client_response(self.broker.fetch(frame), ticket)

    # ---------------------------------------------------------------------------------------- the client

    @rule()
    def fetch(self) -> None:
        sid, epoch = self.session
        full = epoch == 0
        if full:
            offsets, forget = dict(self.wanted), []
        else:  # Java's FetchSessionHandler: added and altered partitions, forgotten ones
            offsets = {k: o for k, o in self.wanted.items() if self.sent.get(k) != o}
            forget = [k for k in self.sent if k not in self.wanted]
        plan = plan_session_request(request(offsets, sid, epoch, forget), self.conn, self.sluice, now=0.0)
        assert plan.answer is None, f"Sluice refused its own session: {plan.answer.error_code}"
        assert plan.kind in (Kind.FULL, Kind.INCREMENTAL) and plan.frame is not None and plan.ticket is not None
        view = build_client_response(self.broker.fetch(plan.frame), plan.ticket)
        if view is None:
            # what the server does when nothing else is in flight: the same request again, as a full session
            again = replan(plan.ticket)
            assert again is not None
            view = build_client_response(self.broker.fetch(again[0]), again[1])
            assert view is not None, "a fresh full upstream session request must succeed"
        assert view.error_code == 0
        got = {(t.topic, p.partition_index): p for t, p in view.partitions()}
        assert set(got) <= set(self.wanted), "a partition outside the client's session"
        if full:
            assert set(got) == set(self.wanted), "a full response must list every partition"
            self.session = (view.session_id, 1)
            self.known_hw = {}
        else:
            assert view.session_id == sid
            self.session = (sid, epoch + 1)
        self.sent = dict(self.wanted)
        for key in forget:
            self.known_hw.pop(key, None)
        for key, p in got.items():
            self.known_hw[key] = p.high_watermark
            data = bytes(p.records or b"")
            if data:
                offsets_got = [int(x) for x in data.decode().split(",")]
                assert offsets_got[0] == self.wanted[key], f"{key}: records from {offsets_got[0]}"
                self.received[key] += offsets_got
                self.wanted[key] = offsets_got[-1] + 1

    # ---------------------------------------------------------------------------------------- the checks

    @invariant()
    def never_a_high_watermark_the_broker_has_not_reached(self) -> None:
        for key, hw in self.known_hw.items():
            assert hw <= self.broker.hw[key]

    @rule()
    def quiet_fetch_tells_everything(self) -> None:
        """With nothing produced in between, one more fetch brings every partition of the session up to date:
        known HW == true HW and every record received."""
        self.fetch()
        for key in self.wanted:
            assert self.known_hw.get(key) == self.broker.hw[key], \
                f"{key}: client knows {self.known_hw.get(key)}, truth {self.broker.hw[key]}"
            assert self.wanted[key] == self.broker.hw[key], f"{key}: records up to {self.wanted[key]} missing"


TestTerminateModel = TerminateModel.TestCase
TestTerminateModel.settings = settings(max_examples=300, stateful_step_count=80, deadline=None)


class SessionlessModel(World):
    """The same for a session-less client (librdkafka, aiokafka): every fetch lists every partition it wants,
    and every response must list them all, with the true high watermark and every record from the fetch offset,
    while Sluice's upstream session carries only changes."""

    corr = 0

    @rule()
    def client_rotates_its_list(self) -> None:
        """librdkafka starts each fetch one partition further on: the same partitions, another order."""
        first = next(iter(self.wanted))
        self.wanted[first] = self.wanted.pop(first)

    @rule()
    def fetch(self) -> None:
        # as the terminate policy reads it: as a difference from the previous request when only some partitions
        # changed (then the response is assembled from the previous one's encoding), else decoded whole
        self.corr += 1
        frame = request_frame(dict(self.wanted), 0, FINAL_EPOCH, corr=self.corr)
        delta = sessionless_delta(frame, self.conn)
        req, changed = delta if delta is not None else (decode_fetch_request(frame), None)
        planned = plan_request(req, self.conn, changed)
        assert planned is not None
        if delta is None:
            set_baseline(self.conn, req, frame, planned[1])
        view = build_client_response(self.broker.fetch(planned[0]), planned[1])
        if view is None:
            again = replan(planned[1])
            assert again is not None
            view = build_client_response(self.broker.fetch(again[0]), again[1])
            assert view is not None, "a fresh full upstream session request must succeed"
        assert (view.error_code, view.session_id) == (0, 0)
        # the access log's listing and a quota's count, read before the response is decoded (a response built
        # from kept encodings answers them from what it was built with: proxy/core/chain.py's _listing, topics
        # named by their keys here), are the decoded response's
        encoded = view.encoded
        named: dict[object, Any] = {t: t for t in encoded.topics} if encoded is not None else {}
        listing = (KeptListing(encoded.partitions, named, encoded.record_sizes).rows()
                   if encoded is not None else list(view.partition_sizes()))
        records_size = view.records_size
        got = {(t.topic, p.partition_index): p for t, p in view.partitions()}
        assert listing == [(t.topic, p.partition_index, p.records_size) for t, p in view.partitions()]
        assert records_size == sum(p.records_size for _, p in view.partitions())
        # every partition asked for, once (in the order of the request Sluice reads later ones against: a client
        # that lists the same partitions in another order, as librdkafka's rotation does, gets that order)
        assert sorted(got) == sorted(self.wanted) and len(got) == len(list(view.partitions()))
        for key, p in got.items():
            assert p.high_watermark == self.broker.hw[key], f"{key}: HW {p.high_watermark}, truth {self.broker.hw[key]}"
            data = bytes(p.records or b"")
            expected = list(range(self.wanted[key], self.broker.hw[key]))
            assert ([int(x) for x in data.decode().split(",")] if data else []) == expected, f"{key}: {data!r}"
            self.received[key] += expected
            self.wanted[key] = self.broker.hw[key]


TestSessionlessModel = SessionlessModel.TestCase
TestSessionlessModel.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
