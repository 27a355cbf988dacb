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
from ..wire.messages import decoded_versions, response_codec
from ..wire.schema import Versions
from ..wire.versions import intersect, offered, unsupported_api_versions_body
from ..wire.views import MessageResponse, ResponseView, local_response

_log = get_logger("sluice.api_versions")

#: answers remembered (:meth:`ApiVersions.on_response`): a broker answers every ApiVersions of a version alike, so a
#: handful of brokers and versions make a handful of entries; past this many the memo starts again
MEMO_ENTRIES = 64


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
        #: (version, the broker's body) -> (the body clients get, the APIs it withholds): every client connection
        #: opens with ApiVersions, and decoding ~90 entries and encoding them again took ~0.7 ms of CPU each time
        self._memo: dict[tuple[int, bytes], tuple[bytes, list[tuple[int, int, int]]]] = {}

    def composed(self, chain: Sequence[Policy]) -> None:
        """Offer clients, per API, only the versions every policy of the chain reads
        (:func:`~proxy.core.policy.versions_read`) on top of what the codecs decode or relay."""
        self._read = versions_read(chain)
        self._memo.clear()

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        h = ex.header
        if h.api_version > self._high:
            ex.answer = local_response(ApiKey.API_VERSIONS, 0, h.correlation_id, unsupported_api_versions_body())
            return None
        ex.collect = True
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        """Cap the broker's ranges (:func:`~proxy.wire.versions.intersect`). The answer to a body seen before is
        remembered: the response's frame becomes its correlation id (ApiVersions answers with header v0 in every
        version, KIP-511) and that answer's body, undecoded, as any relayed frame."""
        assert isinstance(response, MessageResponse)
        key = (response.version, bytes(response.frame[4:]))
        known = self._memo.get(key)
        if known is not None:
            answer, withheld = known
            response.replace_body(answer)
        else:
            body = response.body
            capped, withheld = intersect(body, self._read)
            if body.error_code:  # not remembered: read, its error code reaches the access log
                body.api_keys = capped.api_keys
                response.changed = True
            else:
                answer = response_codec(ApiKey.API_VERSIONS, response.version).encode(capped)
                if len(self._memo) >= MEMO_ENTRIES:
                    self._memo.clear()
                self._memo[key] = answer, withheld
                response.replace_body(answer)
        for api_key, low, high in withheld:
            name = api_name(api_key)
            self.metrics.api_withheld.labels(api=name).inc()
            if api_key not in self._logged:
                self._logged.add(api_key)
                ours = offered(api_key, self._read)
                _log.warning("api_withheld", api=name, api_key=api_key, broker_versions=f"{low}-{high}",
                             sluice_versions=f"{ours.low}-{ours.high}" if ours else None, client_id=ex.client_id)
