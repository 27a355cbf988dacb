"""Every registered policy, driven with every version of every API it declares (proxy/core/policy.py): requests
and responses generated from Kafka's specs, the policy alone on the chain, all of its switches on. Whatever the
content, what comes out is a defined outcome -- the request answered, sent on (its response handled), waiting for
Sluice's own work, or refused (Rejected, CodecError) -- never another exception (PolicyFailed)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from proxy.core.chain import Chain
from proxy.core.exchange import ConnectionInfo, Rejected
from proxy.wire.api_keys import api_name
from proxy.wire.errors import CodecError
from proxy.wire.messages import encode_request, encode_response, request_spec, response_spec
from proxy.wire.model import Message
from rig.chain_rig import SansIOProxy
from rig.fuzz_targets import POLICIES
from rig.specgen import message_strategy

#: every policy's switches on: size limits, throttles, terminate, cooperative consumption for every client (and
#: client "c" a standalone consumer, a member from its first request, so its offsets code runs at once)
EVERYTHING: dict[str, Any] = {**POLICIES, "sharing": {
    "enabled": True, "clients": ["*"], "topics": [{"topic": "*"}],
    "standalone": [{"client_id": "c", "topic": "t", "slice": "0/2"}]}}
NAMES = ("t", "u1")


def _cases() -> list[tuple[str, int, int]]:
    return [(policy.name, key, version) for policy in SansIOProxy(EVERYTHING).chain.policies
            for key, versions in sorted(policy.apis.items()) for version in versions
            if version in request_spec(key).valid]


CASES = _cases()


def test_every_policy_declares_something_to_drive() -> None:
    assert {name for name, _, _ in CASES} == {p.name for p in SansIOProxy(EVERYTHING).chain.policies}


def _alone(name: str) -> tuple[SansIOProxy, Chain]:
    p = SansIOProxy(EVERYTHING)
    policy = p.policy(name)
    return p, Chain([policy], p.metrics, p.names, None)


@pytest.mark.parametrize(("policy", "api_key", "version"), CASES,
                         ids=[f"{n}-{api_name(k)}-v{v}" for n, k, v in CASES])
@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_policy_reads_every_version_it_declares(policy: str, api_key: int, version: int,
                                                  data: st.DataObject) -> None:
    p, chain = _alone(policy)
    body = data.draw(message_strategy(request_spec(api_key), version), label="request")
    header = Message(request_api_key=api_key, request_api_version=version, correlation_id=3,
                     client_id=data.draw(st.sampled_from(["c", "consumer-1", None]), label="client id"))
    frame = encode_request(header, body)
    conn = chain.connect(ConnectionInfo(1, "bootstrap", client_host="10.0.0.1"))
    with capture_logs():
        try:
            ex = chain.classify(frame, p.clock(), conn.info)
            for tid in ex.missing_names:  # Fetch v13+: names as a lookup would have found them
                p.names.learn(tid, data.draw(st.sampled_from(NAMES), label="topic name"))
            chain.on_request(conn, ex)
            calls = p.policy("sharing").calls
            while ex.pending is not None:  # Sluice's own work: group calls and topic-name lookups
                for call in calls.take():  # answered, or failed as a whole
                    if data.draw(st.booleans(), label="group call fails"):
                        call.fail("coordinator unavailable")
                    else:
                        call.settle()
                wanted = p.names.take()  # OffsetFetch/OffsetCommit v10+ name topics by id: found, or unknown
                if wanted:
                    known = data.draw(st.booleans(), label="topic names found")
                    p.names.settle({tid: data.draw(st.sampled_from(NAMES), label="topic name") for tid in wanted}
                                   if known else {}, () if known else wanted)
                assert ex.pending.settled
                chain.on_request(conn, ex)
            if ex.answer is not None or not ex.expects_response:
                return
            answer = data.draw(message_strategy(response_spec(api_key), version), label="response")
            raw = encode_response(api_key, version, Message(correlation_id=3), answer)
            if ex.collect:  # as the connection core does: collected for the policies, walked, or relayed
                ex.may_resend = True
                chain.on_response(conn, ex, raw)
            elif ex.streamer is not None:
                ex.streamer(len(raw)).feed(raw)
        except (Rejected, CodecError):
            pass  # defined outcomes: the connection is closed (counted, logged) by the core
        finally:
            chain.disconnect(conn)
