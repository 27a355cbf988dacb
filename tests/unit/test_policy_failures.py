"""A policy that raises closes only its client connection (proxy/core/chain.py, proxy/core/connection.py): one
``policy_failed`` event naming the policy, the hook, the API and version, ``sluice_policy_errors_total{policy,api}``,
and nothing escapes to the event loop; the other connections carry on."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.core.chain import Chain
from proxy.core.exchange import Arrival, ConnectionInfo, Exchange, Relay, Signal
from proxy.core.policy import Policy, reads
from proxy.wire.api_keys import ApiKey
from proxy.wire.errors import CodecError
from proxy.wire.messages import RequestHeader
from proxy.wire.views import MessageRequest, ResponseView
from rig.core_rig import CoreRig, FakePort, request, response, sized

HOOKS = ("open", "arrival", "applies", "on_request", "on_resume", "on_response", "on_sent", "close")
BAD = 1  # the connection whose requests make the policy raise


class Raises(Policy):
    """Raises RuntimeError in one hook, on connection BAD only; sees every ListOffsets response otherwise."""

    name = "raises"

    def __init__(self, hook: str) -> None:
        self.apis = reads(ApiKey.LIST_OFFSETS)
        self.hook = hook

    def _maybe(self, hook: str, conn_id: int) -> None:
        if hook == self.hook and conn_id == BAD:
            raise RuntimeError(f"boom in {hook}")

    def open(self, info: ConnectionInfo) -> ConnectionInfo:
        self._maybe("open", info.conn_id)
        return info

    def unread(self, api_key: int, version: int) -> Relay:
        return Relay(arrival=self._arrived)  # each request counted as it arrives, then read all the same

    def _arrived(self, header: RequestHeader, size: int, info: ConnectionInfo | None,
                 expects_response: bool) -> Arrival:
        assert info is not None
        self._maybe("arrival", info.conn_id)
        return Arrival(state="arrived")

    def close(self, info: ConnectionInfo) -> None:
        self._maybe("close", info.conn_id)

    def applies(self, ex: Exchange) -> bool:
        assert ex.info is not None
        self._maybe("applies", ex.info.conn_id)
        return True

    def on_request(self, ex: Exchange, info: ConnectionInfo) -> Any:
        self._maybe("on_request", info.conn_id)
        ex.collect = True
        if self.hook == "on_resume":
            ex.pending = Signal(settled=True)
        return "seen"

    def on_resume(self, ex: Exchange, info: ConnectionInfo, state: Any) -> Any:
        self._maybe("on_resume", info.conn_id)
        return state

    def on_response(self, ex: Exchange, response: ResponseView, info: ConnectionInfo, state: Any) -> None:
        self._maybe("on_response", info.conn_id)

    def on_sent(self, ex: Exchange, info: ConnectionInfo, state: Any) -> None:
        self._maybe("on_sent", info.conn_id)


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as events:
        yield events


def exchange(conn: Any, port: FakePort, corr: int) -> bytes:
    """A ListOffsets request and its answer through ``conn``; what the client got."""
    conn.client_data(sized(request(ApiKey.LIST_OFFSETS, 7, corr)))
    if port.take_upstream():
        conn.upstream_data(sized(response(ApiKey.LIST_OFFSETS, 7, corr)))
    return port.take_client()


@pytest.mark.parametrize("hook", HOOKS)
def test_a_policy_that_raises_closes_only_its_connection(hook: str, logs: list[MutableMapping[str, Any]]) -> None:
    rig = CoreRig()
    rig.proxy.chain = Chain([Raises(hook)], rig.metrics, rig.names, rig.access_log)
    bad, bad_port = rig.connect()
    good, good_port = rig.connect()
    rig.advance(0)  # a connection whose open failed is closed once it is set up
    if hook == "close":
        assert exchange(bad, bad_port, 1) == sized(response(ApiKey.LIST_OFFSETS, 7, 1))
        bad.client_lost()  # the close hook raises while the connection goes away: reported, nothing escapes
    else:
        exchange(bad, bad_port, 1)
        assert bad.closed and bad_port.closed is True  # aborted, as a rejected frame is
        assert bad_port.client == b""  # no answer for the request the policy failed on
    failed = [e for e in logs if e["event"] == "policy_failed"]
    assert len(failed) == 1
    event = failed[0]
    api, version = (None, None) if hook in ("open", "close") else ("ListOffsets", 7)
    assert (event["policy"], event["hook"], event["api"], event["version"], event["conn"]) == (
        "raises", hook, api, version, BAD)
    assert (event["error_type"], event["error"], event["log_level"]) == ("RuntimeError", f"boom in {hook}", "error")
    assert rig.metrics.total("sluice_policy_errors_total", policy="raises", api=api or "none") == 1
    # the other connection carries on
    for corr in (2, 3):
        assert exchange(good, good_port, corr) == sized(response(ApiKey.LIST_OFFSETS, 7, corr))
    assert not good.closed
    assert rig.metrics.total("sluice_policy_errors_total") == 1


class ReadsTheRequest(Policy):
    """Reads every ListOffsets request; raises a CodecError of its own on connection BAD when ``own_error``."""

    name = "reads"

    def __init__(self, own_error: bool) -> None:
        self.apis = reads(ApiKey.LIST_OFFSETS)
        self.own_error = own_error

    def on_request(self, ex: Exchange, info: ConnectionInfo) -> Any:
        request = ex.request
        assert isinstance(request, MessageRequest)
        request.body  # noqa: B018 - decoded here: a malformed frame is found by the first policy that reads it
        if self.own_error and info.conn_id == BAD:
            raise CodecError("a value this policy cannot encode")
        return None


def test_a_codec_error_of_the_policys_own_is_its_failure_not_a_malformed_frame(
        logs: list[MutableMapping[str, Any]]) -> None:
    rig = CoreRig()
    rig.proxy.chain = Chain([ReadsTheRequest(own_error=True)], rig.metrics, rig.names, rig.access_log)
    bad, bad_port = rig.connect()
    exchange(bad, bad_port, 1)
    assert bad.closed
    assert [e["policy"] for e in logs if e["event"] == "policy_failed"] == ["reads"]
    assert rig.metrics.total("sluice_policy_errors_total", policy="reads", api="ListOffsets") == 1
    assert rig.rejected("malformed") == 0


def test_a_malformed_frame_a_policy_reads_is_rejected_as_malformed_not_its_failure(
        logs: list[MutableMapping[str, Any]]) -> None:
    rig = CoreRig()
    rig.proxy.chain = Chain([ReadsTheRequest(own_error=False)], rig.metrics, rig.names, rig.access_log)
    bad, bad_port = rig.connect()
    bad.client_data(sized(request(ApiKey.LIST_OFFSETS, 7, 1)[:-3]))  # its body cut short
    assert bad.closed and bad_port.take_upstream() == b""
    assert rig.rejected("malformed") == 1
    assert rig.metrics.total("sluice_policy_errors_total") == 0
    assert [e for e in logs if e["event"] == "policy_failed"] == []
