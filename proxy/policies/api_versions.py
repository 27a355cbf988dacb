"""ApiVersions: clients negotiate only versions Sluice can read (rules in :mod:`proxy.wire.versions`).

The broker's ranges are capped to what Sluice decodes; an ApiVersions request version Sluice does not know is
answered the way Kafka does (error 35, UNSUPPORTED_VERSION, in the v0 layout, naming the supported range).

An API withheld from a client (no version both Sluice and the broker speak) is never silent: each ApiVersions
response that leaves one out counts it in ``sluice_api_withheld_total{api}``, and the first time per API the
operational log says which, with both ranges (``api_withheld``). A client finding an API missing logs it, if at all,
at DEBUG ("The node does not support SHARE_FETCH").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..accesslog import get_logger
from ..core.exchange import Exchange
from ..core.policy import ANY_VERSION, Policy, Services, versions_read
from ..wire.api_keys import ApiKey, api_name
from ..wire.messages import decoded_versions
from ..wire.schema import Versions
from ..wire.versions import intersect, offered, unsupported_api_versions_body
from ..wire.views import MessageResponse, ResponseView, local_response

_log = get_logger("sluice.api_versions")


class ApiVersions(Policy):
    name = "api_versions"
    #: every version: one Sluice does not know is answered here, as Kafka answers it (not refused by the chain)
    apis = MappingProxyType({ApiKey.API_VERSIONS: ANY_VERSION})

    def __init__(self, services: Services) -> None:
        ours = decoded_versions(ApiKey.API_VERSIONS)
        assert ours is not None
        self._high = ours.high
        self.metrics = services.metrics
        self._logged: set[int] = set()  # APIs whose withholding was logged (once per API per proxy)
        #: per API a policy declares, the versions the policies read (the chain refuses others)
        self._read: Mapping[int, Versions] = {}

    def composed(self, chain: Sequence[Policy]) -> None:
        """Offer clients, per API, only the versions every policy of the chain reads
        (:func:`~proxy.core.policy.versions_read`) on top of what the codecs decode or relay."""
        self._read = versions_read(chain)

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        h = ex.header
        if h.api_version > self._high:
            ex.answer = local_response(ApiKey.API_VERSIONS, 0, h.correlation_id, unsupported_api_versions_body())
            return None
        ex.collect = True
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        assert isinstance(response, MessageResponse)
        body = response.body
        capped, withheld = intersect(body, self._read)
        body.api_keys = capped.api_keys
        response.changed = True
        for key, low, high in withheld:
            name = api_name(key)
            self.metrics.api_withheld.labels(api=name).inc()
            if key not in self._logged:
                self._logged.add(key)
                ours = offered(key, self._read)
                _log.warning("api_withheld", api=name, api_key=key, broker_versions=f"{low}-{high}",
                             sluice_versions=f"{ours.low}-{ours.high}" if ours else None, client_id=ex.client_id)
