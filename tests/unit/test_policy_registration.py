"""A new policy is its package and one line in the registration list (proxy/policies/__init__.py), nothing else.

This module plays a policy package: a settings model with one setting, one metric, the chain hooks with one
request of Sluice's own to the cluster (a group description, through ``Services.group_requests``), and its
:class:`~proxy.core.registration.Registration`. Added with one line to a copy of ``POLICIES``, it gets its config
section (TOML, env overrides, error messages naming its key), its metric on the proxy's /metrics, its admin
endpoint (GET/PUT, the state file) and run-time reconfiguration, from code that names no policy.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter
from pydantic import Field

from proxy.config import ConfigError, apply_state_file, compose, load_settings
from proxy.config.base import Section
from proxy.core.exchange import ConnectionInfo, Exchange
from proxy.core.group_calls import GroupCall
from proxy.core.policy import ANY_VERSION, Policy, Services
from proxy.core.registration import Registration
from proxy.policies import POLICIES
from proxy.reconfigure import reload_file
from proxy.server import Proxy
from proxy.wire.api_keys import ApiKey
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from tests.support.admin import admin_over

# ------------------------------------------------------------------------------- the example policy's package


class MarkSettings(Section):
    """``[mark]``: the clients whose ApiVersions requests are counted, once their group is described (the
    example's stand-in for a policy that needs a broker's answer first: the client.id names the group)."""

    client_id: str = Field(default="", description='client.id glob ("" = none).')


class MarkMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.marked = Counter("sluice_mark_requests_total",
                              "ApiVersions requests of the clients [mark] selects whose group was described.",
                              registry=registry)


class Mark(Policy):
    name = "mark"
    apis = MappingProxyType({ApiKey.API_VERSIONS: ANY_VERSION})  # the header only is read

    def __init__(self, settings: MarkSettings, services: Services, metrics: MarkMetrics) -> None:
        self.glob = settings.client_id
        self.metrics = metrics
        self.group_calls = services.group_requests

    def reconfigure(self, settings: Any) -> None:
        self.glob = settings.mark.client_id

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        if not (self.glob and fnmatch.fnmatchcase(ex.client_id or "", self.glob)):
            return None
        # the request waits for the description; the call is this request's state, handed to on_resume
        call = ex.pending = self.group_calls.submit(GroupCall(describe={ex.client_id or ""}))
        return call

    def on_resume(self, ex: Exchange, conn: Any, state: Any) -> Any:
        if state.ok and state.described[ex.client_id].group_state == "Stable":
            self.metrics.marked.inc()
        return None


MARK = Registration(Mark, "mark", MarkSettings, dynamic=True, admin_path="/mark", metrics=MarkMetrics)

# ------------------------------------------------------------------------------------ the one line it takes

POLICIES_WITH_MARK = (*POLICIES, MARK)
Settings = compose(POLICIES_WITH_MARK)

# ------------------------------------------------------------------------------------------------ the tests


def api_versions_from(proxy: Proxy, client_id: str) -> list[set[str]]:
    """One ApiVersions request of ``client_id`` through the proxy's chain (request side), resumed as the connection
    core does after the group calls it waited for; the groups each call described. The proxy is not started, so
    the calls are answered here, as the server would: every group Stable."""
    header = Message(request_api_key=18, request_api_version=3, correlation_id=1, client_id=client_id)
    info = ConnectionInfo(1, "bootstrap")
    conn = proxy.chain.connect(info)
    ex = proxy.chain.classify(encode_request(header, request_codec(18, 3).default()), 0.0, info)
    proxy.chain.on_request(conn, ex)
    described: list[set[str]] = []
    while ex.pending is not None:
        for call in proxy.group_requests.take():
            described.append(set(call.describe))
            call.described = {group: Message(group_id=group, group_state="Stable") for group in call.describe}
            call.settle()
        proxy.chain.on_request(conn, ex)
    return described


def test_the_section_is_loaded_from_toml_and_env_with_errors_naming_its_key(tmp_path: Path) -> None:
    toml = tmp_path / "sluice.toml"
    toml.write_text('[mark]\nclient_id = "etl-*"\n')
    assert load_settings(toml, env={}, model=Settings).mark.client_id == "etl-*"
    env = {"SLUICE_MARK__CLIENT_ID": "batch-*"}
    assert load_settings(toml, env=env, model=Settings).mark.client_id == "batch-*"
    with pytest.raises(ConfigError) as e:
        load_settings(toml, env={"SLUICE_MARK__CLIENT_IDS": "x"}, model=Settings)
    assert str(e.value).startswith("mark.client_ids: unknown key (did you mean 'client_id'?)")
    toml.write_text("[mark]\nclient_id = 3\n")
    with pytest.raises(ConfigError) as e:
        load_settings(toml, env={}, model=Settings)
    assert str(e.value) == f"mark.client_id: input should be a valid string, got 3 (in {toml})"
    # the registered policies' model is untouched: without the line, no section
    with pytest.raises(ConfigError, match=r"^mark: unknown section"):
        load_settings(None, env={"SLUICE_MARK__CLIENT_ID": "x"})
    assert Settings.dynamic_sections == (*load_settings(None, env={}).dynamic_sections, "mark")


async def test_metric_admin_endpoint_state_file_and_reconfiguration(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    settings = load_settings(None, env={}, model=Settings).with_overrides(
        {"mark.client_id": "etl-*", "admin.state_file": str(state_file)})
    async with admin_over(settings) as (proxy, url), aiohttp.ClientSession() as http:
        assert isinstance(proxy.policy("mark"), Mark)
        assert api_versions_from(proxy, "etl-1") == [{"etl-1"}]
        assert api_versions_from(proxy, "web-1") == []
        async with http.get(f"{url}/metrics") as r:
            assert "sluice_mark_requests_total 1.0" in (await r.text()).splitlines()

        async with http.get(f"{url}/mark") as r:
            assert await r.json() == {"client_id": "etl-*", "revision": 0, "store": "this instance"}
        async with http.put(f"{url}/mark", json={"client_id": "web-*"}) as r:
            assert r.status == 200 and await r.json() == {"client_id": "web-*", "revision": 1, "store": "this instance"}
        assert api_versions_from(proxy, "etl-1") == []
        assert api_versions_from(proxy, "web-1") == [{"web-1"}]
        assert api_versions_from(proxy, "web-2") == [{"web-2"}]
        assert proxy.metrics.total("sluice_mark_requests_total") == 3
        async with http.put(f"{url}/mark", json={"client_id": 7}) as r:
            assert r.status == 400 and (await r.json())["key"] == "mark.client_id"
        assert proxy.settings.mark.client_id == "web-*"

    assert json.loads(state_file.read_text())["mark"] == {"client_id": "web-*"}
    # a restart (or SIGHUP) brings the admin change back over the configuration
    assert apply_state_file(settings).mark.client_id == "web-*"


def test_sighup_reload_applies_the_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.upper().startswith("SLUICE_") and "__" in v]:
        monkeypatch.delenv(var)  # the reload reads the process environment, as a SIGHUP does
    toml = tmp_path / "sluice.toml"
    toml.write_text('[mark]\nclient_id = "etl-*"\n')
    proxy = Proxy(load_settings(toml, env={}, model=Settings))
    toml.write_text('[mark]\nclient_id = "web-*"\n')
    assert reload_file(proxy, str(toml))
    assert proxy.settings.mark.client_id == "web-*"
    assert api_versions_from(proxy, "etl-1") == []
    assert api_versions_from(proxy, "web-1") == [{"web-1"}]
    assert proxy.metrics.total("sluice_mark_requests_total") == 1


def test_a_section_is_registered_once() -> None:
    with pytest.raises(ValueError, match=r"^sections registered twice: mark$"):
        compose((*POLICIES_WITH_MARK, MARK))
    with pytest.raises(ValueError, match=r"^sections registered twice: listen$"):
        compose((*POLICIES, Registration(Mark, "listen", MarkSettings)))
