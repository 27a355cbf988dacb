"""Client quotas (proxy/policies/quota), driven through the connection core with a fake port and clock: the
throttle time Kafka's formula gives, written into the response's throttle_time_ms (the larger of the broker's
and Sluice's), the client not read for that long (KIP-219), acks=0 Produce held the same way, shared and
per-client quotas, run-time changes and the settings' errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.pipeline_cpu import request_frame, response_frame
from proxy.app import load_settings
from proxy.config import ConfigError
from proxy.core.exchange import Relay
from proxy.core.policy import Policy
from proxy.core.rate import WindowedRate
from proxy.policies.quota import Quota
from proxy.policies.quota.book import Kind, QuotaBook, Quotas
from proxy.policies.terminate.sessions import LEGACY
from proxy.wire.fetch_layout import PartitionKey
from proxy.wire.fetch_request_fast import decode_fetch_request
from proxy.wire.messages import decode_request, decode_response, request_codec, response_codec
from proxy.wire.throttle_time import set_throttle_time_ms, throttle_time_ms
from proxy.wire.views import MessageResponse, response_view
from rig.chain_rig import SansIOProxy
from rig.core_rig import CoreRig, request, response, sized
from tests.support.admin import admin_over, call

PRODUCE, FETCH = 0, 1
CLIENT = "etl-1"


def produce(corr: int, acks: int = 1, version: int = 9, client_id: str = CLIENT) -> bytes:
    return request(PRODUCE, version, corr, request_codec(PRODUCE, version).default().replace(acks=acks),
                   client_id=client_id)


def produce_response(corr: int, version: int = 9, throttle_ms: int = 0) -> bytes:
    return response(PRODUCE, version, corr, response_codec(PRODUCE, version).default().replace(
        throttle_time_ms=throttle_ms))


def throttle_of(frame: bytes, api_key: int, version: int) -> int:
    """The throttle_time_ms of a response frame as the client reads it (size prefix included)."""
    _, body = decode_response(api_key, version, frame[4:])
    return int(body.throttle_time_ms)


def rig_with(**entry: Any) -> CoreRig:
    return CoreRig({"quota.entries": [{"client_id": "etl-*", **entry}]})


def test_the_throttle_time_brings_the_rate_back_to_the_bound() -> None:
    # Kafka's (rate - bound) / bound * window, with this rate's window (the time since its oldest sample)
    q = WindowedRate(bound=100, samples=11, window_s=1.0)
    q.record(300, 10.0)
    assert q.throttle_time(10.0) == pytest.approx(3.0)
    assert q.rate(13.0) == pytest.approx(100.0) and not q.exceeded(13.0)
    q.record(50, 12.0)  # more, sooner: the time grows by what was added
    assert q.throttle_time(12.0) == pytest.approx(1.5)
    assert WindowedRate(bound=0).throttle_time(0.0) == 0.0


def test_an_over_quota_produce_gets_the_time_in_its_response_and_is_not_read_for_as_long() -> None:
    frame = produce(1)
    size = len(frame) + 4
    rig = rig_with(produce_rate_bytes=size // 2)  # one request is two seconds' worth
    conn, port = rig.connect()
    conn.client_data(sized(frame))
    assert not port.client_paused  # the request goes upstream at once: nothing is held before the broker
    assert port.take_upstream() == sized(frame)
    conn.upstream_data(sized(produce_response(1)))
    expected = size / (size // 2)
    assert throttle_of(port.take_client(), PRODUCE, 9) == math.ceil(expected * 1000)
    assert port.client_paused and port.named("call_later")[-1] == ("call_later", pytest.approx(expected))
    rig.advance(expected - 0.01)
    assert port.client_paused
    rig.advance(0.01)
    assert not port.client_paused
    [line] = rig.lines()
    assert line["quota_throttle_time_ms"] == math.ceil(expected * 1000)
    assert rig.metrics.total("sluice_quota_throttle_seconds_total", entry="entries[0]", api="Produce") \
        == pytest.approx(expected)
    assert rig.metrics.total("sluice_quota_bytes_total", entry="entries[0]", kind="produce") == size


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11])
def test_throttle_time_is_written_where_each_produce_version_carries_it(version: int) -> None:
    rig = rig_with(produce_rate_bytes=10)
    conn, port = rig.connect()
    frame = produce(1, version=version)
    conn.client_data(sized(frame))
    conn.upstream_data(sized(produce_response(1, version)))
    reply = port.take_client()
    assert throttle_of(reply, PRODUCE, version) == math.ceil((len(frame) + 4) * 100)
    # nothing else changed: the response is the broker's with that one field
    _, body = decode_response(PRODUCE, version, reply[4:])
    assert body.replace(throttle_time_ms=0) == response_codec(PRODUCE, version).default()


def test_the_throttle_time_is_bounded_by_the_quota_window() -> None:
    # 31 bytes against 1 B/s would be 31 s; Kafka bounds a throttle time by the quota's window (11 x 1 s)
    rig = rig_with(produce_rate_bytes=1)
    conn, port = rig.connect()
    conn.client_data(sized(produce(1)))
    conn.upstream_data(sized(produce_response(1)))
    assert throttle_of(port.take_client(), PRODUCE, 9) == 11_000


def test_the_brokers_larger_throttle_time_is_kept() -> None:
    rig = rig_with(produce_rate_bytes=1000)
    conn, port = rig.connect()
    conn.client_data(sized(produce(1)))
    conn.upstream_data(sized(produce_response(1, throttle_ms=5)))  # within Sluice's quota: the broker's 5 ms
    assert throttle_of(port.take_client(), PRODUCE, 9) == 5 and not port.client_paused
    rig2 = rig_with(produce_rate_bytes=10)
    conn2, port2 = rig2.connect()
    conn2.client_data(sized(produce(1)))
    conn2.upstream_data(sized(produce_response(1, throttle_ms=600_000)))
    assert throttle_of(port2.take_client(), PRODUCE, 9) == 600_000
    assert port2.client_paused  # Sluice's own (shorter) mute all the same: the broker mutes its own channel


@pytest.mark.parametrize("version", [9, 11])  # 11: the addresses policy skims it for KIP-951 NodeEndpoints too
def test_a_produce_within_quota_passes_unchanged_and_unread(version: int) -> None:
    # nothing to tell the client: the quota does not collect the response, which is relayed as it came
    rig = rig_with(produce_rate_bytes=10_000)
    conn, port = rig.connect()
    conn.client_data(sized(produce(1, version=version)))
    conn.upstream_data(sized(produce_response(1, version=version)))
    assert port.take_client() == sized(produce_response(1, version=version)) and not port.client_paused
    [line] = rig.lines()
    assert line["quota_throttle_time_ms"] == 0 and line["decoded"] is False


def test_an_acks_0_produce_is_held_from_the_moment_it_goes_upstream() -> None:
    frame = produce(1, acks=0)
    size = len(frame) + 4
    rig = rig_with(produce_rate_bytes=size)
    conn, port = rig.connect()
    conn.client_data(sized(frame))  # within: one second's worth
    assert not port.client_paused
    conn.client_data(sized(produce(2, acks=0)))  # over: two seconds' worth, held until the second one ends
    assert port.take_upstream() == sized(frame, produce(2, acks=0))  # nothing refused, nothing dropped
    assert port.client_paused and port.named("call_later")[-1] == ("call_later", pytest.approx(2.0))
    assert port.take_client() == b""
    rig.advance(1.99)
    assert port.client_paused
    rig.advance(0.01)
    assert not port.client_paused
    assert [ln["quota_throttle_time_ms"] for ln in rig.lines()] == [0, 2000]


def test_a_fetch_is_metered_by_its_response_bytes() -> None:
    keys: list[PartitionKey] = [("t", 0), ("t", 1)]
    reply = response_frame(12, 1, keys, 0, 0)
    rig = CoreRig({"quota.entries": [{"client_id": "bench-*", "fetch_rate_bytes": len(reply) + 4}]})
    conn, port = rig.connect()
    conn.client_data(sized(request_frame(12, 1, dict.fromkeys(keys, 0), LEGACY)))
    conn.upstream_data(sized(reply))
    assert throttle_of(port.take_client(), FETCH, 12) == 0 and not port.client_paused  # one second's worth
    conn.client_data(sized(request_frame(12, 2, dict.fromkeys(keys, 0), LEGACY)))
    conn.upstream_data(sized(response_frame(12, 2, keys, 0, 0)))
    assert throttle_of(port.take_client(), FETCH, 12) == 2000 and port.client_paused
    assert rig.metrics.total("sluice_quota_bytes_total", entry="entries[0]", kind="fetch") == 2 * (len(reply) + 4)


@pytest.mark.parametrize(("client_max", "sent_max"), [(50 << 20, 100_000), (60_000, 60_000)])
def test_a_fetch_asks_for_at_most_a_tenth_of_a_seconds_quota(client_max: int, sent_max: int) -> None:
    # a response is the quota's unit: a smaller one keeps every window near the quota; a smaller ask is kept
    keys = [("t", 0), ("t", 1)]
    rig = CoreRig({"quota.entries": [{"client_id": "bench-*", "fetch_rate_bytes": 1_000_000}]})
    conn, port = rig.connect()
    frame = request_frame(12, 1, dict.fromkeys(keys, 0), LEGACY)
    asked = decode_fetch_request(frame)
    conn.client_data(sized(request_frame(12, 1, dict.fromkeys(keys, 0), LEGACY, max_bytes=client_max)))
    sent = decode_fetch_request(port.take_upstream()[4:])
    assert sent.max_bytes == sent_max
    assert sent.partitions() == asked.partitions()  # only MaxBytes changes


def test_a_request_rate_counts_requests() -> None:
    rig = rig_with(request_rate=2)
    conn, port = rig.connect()
    for corr in (1, 2, 3):
        conn.client_data(sized(produce(corr)))
        conn.upstream_data(sized(produce_response(corr)))
    replies = [throttle_of(sized(f), PRODUCE, 9) for f in _frames(port.take_client())]
    assert replies == [0, 0, 1500]  # three requests at once against 2/s: back at the bound after 1.5 s


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_a_shared_quota_holds_every_client_an_entry_selects_together(shared: bool) -> None:
    frame = produce(1)
    size = len(frame) + 4
    rig = rig_with(produce_rate_bytes=size, shared=shared)
    replies = []
    for client_id in ("etl-1", "etl-2"):
        conn, port = rig.connect()
        conn.client_data(sized(produce(1, client_id=client_id)))
        conn.upstream_data(sized(produce_response(1)))
        replies.append(throttle_of(port.take_client(), PRODUCE, 9))
    assert replies == ([0, 2000] if shared else [0, 0])  # two seconds' worth: back at the bound at 2 s


def test_clients_no_entry_selects_are_not_metered() -> None:
    rig = rig_with(produce_rate_bytes=1)
    conn, port = rig.connect()
    conn.client_data(sized(produce(1, client_id="web-1")))
    conn.upstream_data(sized(produce_response(1)))
    assert port.take_client() == sized(produce_response(1)) and not port.client_paused
    assert "quota_throttle_time_ms" not in rig.lines()[0]


def test_a_new_bound_applies_to_the_next_requests() -> None:
    frame = produce(1)
    size = len(frame) + 4
    rig = rig_with(produce_rate_bytes=size)
    conn, port = rig.connect()
    conn.client_data(sized(frame))
    conn.upstream_data(sized(produce_response(1)))
    assert throttle_of(port.take_client(), PRODUCE, 9) == 0
    settings = rig.proxy.settings.with_overrides({"quota.entries": [{"client_id": "etl-*",
                                                                     "produce_rate_bytes": size // 4}]})
    rig.proxy.apply_dynamic(settings)
    conn.client_data(sized(produce(2)))
    conn.upstream_data(sized(produce_response(2)))
    assert throttle_of(port.take_client(), PRODUCE, 9) > 0
    settings = settings.with_overrides({"quota.entries": [{"client_id": "etl-*", "produce_rate_bytes": 0}]})
    rig.proxy.apply_dynamic(settings)  # 0 = none
    rig.advance(10)
    conn.client_data(sized(produce(3)))
    conn.upstream_data(sized(produce_response(3)))
    assert port.take_client() == sized(produce_response(3))


@pytest.mark.parametrize(("entry", "message"), [
    ({"client_id": "etl-*", "produce_rate_bytes": -1},
     "quota.entries[0].produce_rate_bytes: must be at least 0"),
    ({"produce_rate_bytes": 5},
     "quota.entries[0].client_id: set at least one of principal, client_id, client_address"),
    ({"client_id": "etl-*", "request_rate": "fast"}, "quota.entries[0].request_rate: expected a number"),
    ({"client_address": "10.0.0.300/8", "fetch_rate_bytes": 5}, "quota.entries[0].client_address: "),
])
def test_bad_settings_name_the_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(None, env={}).with_overrides({"quota.entries": [entry]})
    assert str(e.value).startswith(message)


def test_two_entries_with_one_name_are_an_error() -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(None, env={}).with_overrides({"quota.entries": [
            {"name": "etl", "client_id": "a", "produce_rate_bytes": 1},
            {"name": "etl", "client_id": "b", "produce_rate_bytes": 1}]})
    assert str(e.value).startswith("quota.entries[1].name: 'etl' is already quota.entries[0]")


def test_quota_metrics_carry_the_entry_name() -> None:
    rig = CoreRig({"quota.entries": [{"name": "etl", "client_id": "etl-*", "request_rate": 100}]})
    samples = {(s.name, tuple(sorted(s.labels.items()))) for m in rig.metrics.registry.collect()
               for s in m.samples if s.name.startswith("sluice_quota_throttle_seconds_total")}
    assert samples == {("sluice_quota_throttle_seconds_total", (("api", api), ("entry", "etl")))
                       for api in ("Produce", "Fetch", "ShareFetch", "ShareAcknowledge")}  # at 0 from the start
    conn, _ = rig.connect()
    conn.client_data(sized(produce(1)))
    assert rig.metrics.total("sluice_quota_requests_total", entry="etl", api="Produce") == 1



def test_idle_clients_rates_are_forgotten() -> None:
    quotas = Quotas.from_settings(load_settings(None, env={}).with_overrides(
        {"quota.entries": [{"client_id": "*", "produce_rate_bytes": 100}]}).quota)
    book = QuotaBook(quotas)
    [entry] = quotas.entries

    def record(client_id: str, now: float) -> None:
        book.record(entry, "produce", 10, entry.key("produce", client_id, None, ""), now)

    for i in range(1024):
        record(f"job-{i}", 0.0)
    record("job-0", 20.0)  # still there, active again
    assert len(book.rates) == 1024
    record("new", 20.0)  # the 1025th: the idle ones go (11 s window passed)
    assert set(book.rates) == {("entries[0]", "produce", None, "job-0", None),
                               ("entries[0]", "produce", None, "new", None)}


async def test_quotas_change_at_run_time_through_the_admin_api() -> None:
    settings = load_settings(None, env={}).with_overrides(
        {"quota.entries": [{"name": "etl", "client_id": "etl-*", "produce_rate_bytes": 1000}]})
    async with admin_over(settings) as (proxy, url):
        body = (await call("GET", f"{url}/quotas")).json()
        assert body["entries"][0]["produce_rate_bytes"] == 1000
        assert body["status"] == {"entities": [], "more_entities": 0}
        body["entries"][0]["produce_rate_bytes"] = -5
        r = await call("PUT", f"{url}/quotas", body)
        assert r.status == 400 and r.json()["key"] == "quota.entries[0].produce_rate_bytes"
        body["entries"][0]["produce_rate_bytes"] = 2000
        assert (await call("PUT", f"{url}/quotas", body)).status == 200
        quota = proxy.policy("quota")
        assert isinstance(quota, Quota) and quota.book.quotas.entries[0].produce == 2000


@pytest.mark.parametrize("changed", [False, True])
def test_a_fetch_response_carries_the_time_whether_or_not_a_policy_changed_it(changed: bool) -> None:
    frame = response_frame(12, 7, [("t", 0)], 5, 0)
    view = response_view(FETCH, 12, frame)
    view.changed = changed  # another policy edited the view: the time goes out in its encoding
    assert throttle_time_ms(FETCH, 12, view) == 0
    set_throttle_time_ms(FETCH, 12, view, 1234)
    buffers, _ = view.encode()
    assert throttle_of(b"".join(bytes(b) for b in buffers), FETCH, 12) == 1234


def test_a_decoded_produce_response_carries_the_time_in_its_body() -> None:
    view = response_view(PRODUCE, 11, produce_response(3, 11, throttle_ms=7))
    assert isinstance(view, MessageResponse) and view.body.throttle_time_ms == 7  # decoded by another policy
    assert throttle_time_ms(PRODUCE, 11, view) == 7
    set_throttle_time_ms(PRODUCE, 11, view, 900)
    buffers, _ = view.encode()
    assert throttle_of(b"".join(bytes(b) for b in buffers), PRODUCE, 11) == 900


# ------------------------------------------------------------------------------- followers, share consumers


@pytest.mark.parametrize("version", [12, 15, 17])  # 15+: the replica id in the tagged ReplicaState (KIP-903)
def test_a_followers_fetch_is_neither_counted_nor_held(version: int) -> None:
    """Kafka applies no client quota to replication: a catch-all fetch quota leaves a follower's fetch alone,
    request and response, while a consumer's identical fetch is metered."""
    p = SansIOProxy({"quota.entries": [{"client_id": "<default>", "fetch_rate_bytes": 10, "request_rate": 1}]})
    keys: list[tuple[Any, int]] = [("t", 0) if version < 13 else (bytes(range(16)), 0)]
    body = request_codec(FETCH, version).default()
    follower = (body.replace(replica_state=body.replica_state.replace(replica_id=2, replica_epoch=7))
                if version >= 15 else body.replace(replica_id=2))
    frame = request(FETCH, version, 1, follower, client_id="broker-2-fetcher-0")
    for _ in range(3):
        ex = p.request(frame)
        assert ex.frame == frame  # MaxBytes untouched
        assert p.respond(ex, response_frame(version, 1, keys, 5, 0))[4:] == response_frame(version, 1, keys, 5, 0)
        assert ex.mute_s == 0 and "quota_throttle_time_ms" not in ex.log
    assert p.metrics.total("sluice_quota_bytes_total", entry="entries[0]", kind="fetch") == 0
    assert p.metrics.total("sluice_quota_requests_total", entry="entries[0]", api="Fetch") == 0
    consumer: list[PartitionKey] = [("t", 0)]
    ex = p.request(request_frame(12, 2, dict.fromkeys(consumer, 0), LEGACY))  # a consumer: counted and held
    p.respond(ex, response_frame(12, 2, consumer, 5, 0))
    assert ex.mute_s > 0 and p.metrics.total("sluice_quota_bytes_total", entry="entries[0]", kind="fetch") > 0


def _share_fetch_exchange(p: SansIOProxy, version: int, max_bytes: int, lock_ms: int = 30_000,
                          records: bytes = b"\x00" * 5000) -> tuple[Any, bytes, bytes]:
    """A ShareFetch through ``p`` and the broker's response to it: (exchange, sent upstream, what the client got)."""
    from tests.unit.test_share_policies import frame as share_frame
    from tests.unit.test_share_policies import share_fetch, share_fetch_response

    ex = p.request(share_frame(version, share_fetch(version, max_bytes=max_bytes)))
    sent = ex.frame
    raw = bytearray(share_fetch_response(version, records, [(0, 9)]))
    if lock_ms != 30_000:
        body = decode_response(SHARE_FETCH, version, raw)[1].replace(acquisition_lock_timeout_ms=lock_ms)
        raw = bytearray(response(SHARE_FETCH, version, 3, body))
    return ex, sent, p.respond(ex, bytes(raw))


SHARE_FETCH, SHARE_ACK = 78, 79


@pytest.mark.parametrize("version", [1, 2])
def test_a_share_consumer_is_held_on_the_request_side_and_its_response_passes_whole(version: int) -> None:
    rate = 2000
    p = SansIOProxy({"quota.entries": [{"client_id": "share-*", "fetch_rate_bytes": rate}]})
    ex, sent, got = _share_fetch_exchange(p, version, 50 << 20)
    # MaxBytes: a tenth of a second's quota, like a Fetch's (the response is the quota's unit)
    assert decode_request(sent)[1].max_bytes == rate // 10
    # the broker's response, whole: every record it acquired for the member reaches it (only throttle_time_ms set)
    _, body = decode_response(SHARE_FETCH, version, got[4:])
    assert len(body.responses[0].partitions[0].records) == 5000
    size = p.metrics.total("sluice_quota_bytes_total", entry="entries[0]", kind="fetch")
    assert size == len(got)  # the response's size, as Kafka records it (ShareFetchContext.responseSize)
    assert body.throttle_time_ms == math.ceil(size / rate * 1000) and ex.mute_s == pytest.approx(size / rate)
    # over the quota now: the next one asks for as much (the mute, not a smaller response, holds the client)
    _, sent2, _ = _share_fetch_exchange(p, version, 50 << 20)
    assert decode_request(sent2)[1].max_bytes == rate // 10


def test_a_share_consumers_mute_stays_within_its_acquisition_lock() -> None:
    """A share consumer muted past its acquisition lock would see its records redelivered (and archived past the
    delivery limit): the mute and the time it is told are capped at half the lock."""
    p = SansIOProxy({"quota.entries": [{"client_id": "share-*", "fetch_rate_bytes": 100, "request_rate": 0.1}]})
    ex, _, got = _share_fetch_exchange(p, 2, 50 << 20, lock_ms=2000, records=b"\x00" * 50_000)
    assert ex.mute_s == pytest.approx(1.0)  # 11 s earned (the window's bound), 1 s allowed
    assert decode_response(SHARE_FETCH, 2, got[4:])[1].throttle_time_ms == 1000
    ack = request(SHARE_ACK, 2, 4, request_codec(SHARE_ACK, 2).default().replace(group_id="g", member_id="m"),
                  client_id="share-1")
    ex = p.request(ack)  # its request quota is exceeded: held, within the lock the connection last saw
    reply = p.respond(ex, response(SHARE_ACK, 2, 4))
    assert ex.mute_s == pytest.approx(1.0) and decode_response(SHARE_ACK, 2, reply[4:])[1].throttle_time_ms == 1000
    assert p.metrics.total("sluice_quota_requests_total", entry="entries[0]", api="ShareAcknowledge") == 1


def test_share_acknowledge_counts_only_against_a_request_rate() -> None:
    """Kafka counts a ShareAcknowledge against the request quota only (sendMaybeThrottle): with no request_rate
    set, the quota leaves it unread."""
    p = SansIOProxy({"quota.entries": [{"client_id": "share-*", "fetch_rate_bytes": 100}]})
    ack = request(SHARE_ACK, 2, 4, request_codec(SHARE_ACK, 2).default(), client_id="share-1")
    assert p.policy("quota").unread(SHARE_ACK, 2)
    p2 = SansIOProxy({"quota.entries": [{"client_id": "share-*", "request_rate": 1}]})
    assert not p2.policy("quota").unread(SHARE_ACK, 2)
    for _ in range(2):
        ex = p2.request(ack)
        p2.respond(ex, response(SHARE_ACK, 2, 4))
    assert ex.mute_s == pytest.approx(2.0)  # two at once against 1/s: back at the bound after 2 s
    assert p.metrics.total("sluice_quota_requests_total", entry="entries[0]", api="ShareAcknowledge") == 0


def test_principal_and_address_select_through_the_core() -> None:
    """The wiring: the connection's principal and address reach the resolver; the most specific entry governs."""
    frame = produce(1, client_id="app")
    size = len(frame) + 4
    rig = CoreRig({"quota.entries": [
        {"name": "default", "client_id": "<default>", "produce_rate_bytes": 10 * size},
        {"name": "office", "client_address": "10.9.0.0/16", "produce_rate_bytes": size // 2},
        {"name": "ops", "principal": "ops", "produce_rate_bytes": 0}]})
    for host, principal, entry, held in [("10.1.0.1", None, "default", False), ("10.9.0.1", None, "office", True),
                                         ("10.9.0.1", "ops", None, False)]:
        conn, port = rig.connect(host=host, principal=principal)
        conn.client_data(sized(frame))
        conn.upstream_data(sized(produce_response(1)))
        assert port.client_paused is held, (host, principal)
        if entry is not None:
            assert rig.metrics.total("sluice_quota_requests_total", entry=entry, api="Produce") >= 1
    assert rig.metrics.total("sluice_quota_requests_total", entry="ops", api="Produce") == 0  # exempt: not counted


def test_an_api_no_entry_counts_is_left_unread() -> None:
    """A produce-only configuration reads no Fetch: each kind's APIs are relayed untouched unless an entry sets a
    kind they are counted on (every data-path API counts on the request kind)."""
    def unread(quota: Policy, key: int) -> bool | str:
        # a Produce is counted on arrival: relayed unread (its response too) unless it earns a throttle time
        terms = quota.unread(key, 12)
        if isinstance(terms, Relay):
            assert terms.arrival is not None and not terms.reads_response
            return "on arrival"
        return terms

    quota = SansIOProxy({"quota.entries": [{"client_id": "a", "produce_rate_bytes": 1}]}).policy("quota")
    assert [unread(quota, k) for k in (PRODUCE, FETCH, SHARE_FETCH, SHARE_ACK)] == ["on arrival", True, True, True]
    quota = SansIOProxy({"quota.entries": [{"client_id": "a", "request_rate": 1}]}).policy("quota")
    assert [unread(quota, k) for k in (PRODUCE, FETCH, SHARE_FETCH, SHARE_ACK)] == ["on arrival"] + [False] * 3


#: the metering property's quota: a byte rate two or three requests exceed and a request rate, for etl-* clients
METERED: dict[str, Any] = {"quota.entries": [{"client_id": "etl-*", "produce_rate_bytes": 300, "request_rate": 4}]}
#: one Produce: its client.id (its size with it), acks, the seconds before it, the broker's throttle_time_ms
Step = tuple[str, int, float, int]


def _metered(steps: list[Step], read_every: bool) -> tuple[list[Any], list[dict[str, Any]], list[float]]:
    """``steps`` through the core: per request what went upstream, what the client got and whether it was held,
    the access log's lines and the quota's metrics; with ``read_every``, each Produce walked through the policies
    as an Exchange (no relay route: the path a request takes behind another that waits), else relayed unless it
    earned a throttle time. Checked against Kafka's arithmetic (a QuotaBook fed the same requests) as it goes."""
    rig = CoreRig(METERED)
    if read_every:
        rig.proxy.chain._routes.clear()
        rig.proxy.chain._declined.clear()
    oracle = SansIOProxy(METERED).policy("quota")
    assert isinstance(oracle, Quota)
    conn, port = rig.connect()
    seen: list[Any] = []
    for corr, (client_id, acks, wait, broker_ms) in enumerate(steps, 1):
        rig.advance(wait)
        while port.client_paused:  # a client held reads nothing: its next request comes once it is let go
            rig.advance(0.25)
        frame = produce(corr, acks=acks, client_id=client_id)
        delay = 0.0
        gov = oracle.book.quotas.governing(client_id, None, "")
        counted: tuple[tuple[Kind, int], ...] = (("request", 1), ("produce", len(frame) + 4))
        for kind, amount in counted:
            entry = gov.entry(kind)
            if entry is not None:
                key = entry.key(kind, client_id, None, "")
                delay = max(delay, oracle.book.record(entry, kind, amount, key, rig.clock()))
        earned = math.ceil(delay * 1000)
        conn.client_data(sized(frame))
        assert port.take_upstream() == sized(frame)  # every request goes upstream as it came
        reply = b""
        if acks:
            conn.upstream_data(sized(produce_response(corr, throttle_ms=broker_ms)))
            reply = port.take_client()
            # the broker's response unread when nothing was earned; else its time, never lowered (KIP-219)
            assert reply == sized(produce_response(corr, throttle_ms=max(broker_ms, earned)))
        assert port.client_paused == (delay > 0)  # held for what it earned, acks=0 too
        line = rig.lines()[-1]
        assert line.get("quota_throttle_time_ms") == (earned if gov.entries else None)
        seen.append((reply, port.client_paused, port.named("call_later")[-1:]))
    metrics = [rig.metrics.total(name) for name in ("sluice_quota_bytes_total", "sluice_quota_requests_total",
                                                    "sluice_quota_throttle_seconds_total",
                                                    "sluice_quota_throttled_total")]
    return seen, rig.lines(), metrics


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["etl-1", "etl-22222222", "ops"]), st.sampled_from([0, 1]),
                          st.sampled_from([0.0, 0.1, 1.0, 5.0]), st.sampled_from([0, 5, 20_000])),
                min_size=1, max_size=10))
def test_a_produce_is_metered_alike_relayed_or_read(steps: list[Step]) -> None:
    """A Produce is counted as it arrives and read only when it earned a throttle time (else relayed unread): the
    same responses, holds, access-log lines and metrics as when every Produce is read, each as Kafka's quota
    arithmetic says."""
    assert _metered(steps, read_every=False) == _metered(steps, read_every=True)
