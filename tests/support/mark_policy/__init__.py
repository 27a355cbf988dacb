"""An example policy package, as another Python package would bring one: everything a policy adds, declared in its
:class:`~proxy.core.registration.Registration` (:data:`REGISTRATION`), and nothing of Sluice changed for it. The
one line that plugs it in is an entry point (``sluice.policies``: ``mark = tests.support.mark_policy:REGISTRATION``,
proxy/app.py) or, in a test, one more entry in a copy of the registry.

``[mark] client_id`` selects clients; each ApiVersions request of a selected client waits while Sluice asks the
cluster for its broker-wide configuration (DescribeConfigs, an API no built-in policy uses, through
``Services.broker``), then is counted (``sluice_mark_requests_total``) and its access-log line carries how many
configuration entries the answer had (``mark_config_entries``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from types import MappingProxyType
from typing import Annotated, Any

from prometheus_client import CollectorRegistry, Counter

from proxy.config.base import Meta, Section
from proxy.core.broker_calls import ANY_BROKER, Call
from proxy.core.exchange import Exchange
from proxy.core.policy import ANY_VERSION, Policy, Services
from proxy.core.registration import Registration
from proxy.wire.api_keys import ApiKey, api_key
from proxy.wire.messages import request_codec
from proxy.wire.model import Message

DESCRIBE_CONFIGS = api_key("DescribeConfigs")
#: DescribeConfigs v4 (KIP-569: with documentation); resource type 4 = BROKER, name "" = the cluster's defaults
DESCRIBE_CONFIGS_VERSION, BROKER_RESOURCE = 4, 4


class MarkSettings(Section, kw_only=True, frozen=True):
    """``[mark]``: the clients whose ApiVersions requests are counted once the cluster's configuration is read."""

    client_id: Annotated[str, Meta(description='client.id glob ("" = none: the policy does nothing).')] = ""


class MarkMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.marked = Counter("sluice_mark_requests_total",
                              "ApiVersions requests of the clients [mark] selects, counted once the cluster's "
                              "broker configuration was read.", registry=registry)


class Mark(Policy):
    name = "mark"
    apis = MappingProxyType({ApiKey.API_VERSIONS: ANY_VERSION})  # the header only is read

    def __init__(self, settings: MarkSettings, services: Services, metrics: MarkMetrics) -> None:
        self.glob = settings.client_id
        self.metrics = metrics
        self.broker = services.broker

    def reconfigure(self, section: MarkSettings) -> Callable[[], None]:
        glob = section.client_id
        return lambda: setattr(self, "glob", glob)

    def unread(self, api_key: int, version: int) -> bool:
        return not self.glob  # switched off: no request is its business, each is relayed unread

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        if not (self.glob and fnmatch.fnmatchcase(ex.client_id or "", self.glob)):
            return None
        body = request_codec(DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION).default().replace(resources=[
            Message(resource_type=BROKER_RESOURCE, resource_name="", configuration_keys=None)])
        # the request waits for the answer; the call is this request's state, handed to on_resume
        call = ex.pending = self.broker.send(DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION, body, to=ANY_BROKER)
        return call

    def on_resume(self, ex: Exchange, conn: Any, state: Call) -> Any:
        if state.ok and state.answer is not None:
            self.metrics.marked.inc()
            ex.log["mark_config_entries"] = sum(len(r.configs) for r in state.answer.results)
        return None


REGISTRATION = Registration(
    Mark, "mark", MarkSettings, dynamic=True, admin_path="/mark", metrics=MarkMetrics,
    log_fields={"mark_config_entries": "int: on ApiVersions lines of the clients [mark] selects, the cluster's "
                                       "broker configuration entries"})
