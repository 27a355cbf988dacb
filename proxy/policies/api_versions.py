"""ApiVersions: clients negotiate only versions Sluice can read (rules in :mod:`proxy.wire.versions`).

The broker's ranges are capped to what Sluice decodes; an ApiVersions request version Sluice does not know is
answered the way Kafka does (error 35, UNSUPPORTED_VERSION, in the v0 layout, naming the supported range).

An API withheld from a client (no version both Sluice and the broker speak) is never silent: each ApiVersions
response that leaves one out counts it in ``sluice_api_withheld_total{api}``, and the first time per API the
operational log says which, with both ranges (``api_withheld``). A client finding an API missing logs it, if at all,
at DEBUG ("The node does not support SHARE_FETCH").
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..accesslog import get_logger
from ..core.exchange import Exchange
from ..core.policy import ANY_VERSION, Policy, Services, versions_read
from ..wire.api_keys import ApiKey, api_name
from ..wire.compiler import head_codec
from ..wire.messages import decoded_versions, response_spec
from ..wire.schema import Versions
from ..wire.versions import intersect, offered, unsupported_api_versions_body
from ..wire.views import MessageResponse, ResponseView, local_response

_log = get_logger("sluice.api_versions")

#: answers remembered (:meth:`ApiVersions.on_response`): a broker lists the same ApiKeys in every ApiVersions of a
#: version, so a handful of brokers and versions make a handful of entries; past this many the memo starts again
MEMO_ENTRIES = 64
#: the fields of the body the memo covers: its head, up to and including ApiKeys
_HEAD_LAST_FIELD = "api_keys"


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
        #: (version, the broker's head: ErrorCode and ApiKeys) -> (the head clients get, the APIs it withholds):
        #: every client connection opens with ApiVersions, and decoding ~90 entries and encoding them again costs
        #: ~1 ms of CPU on the loop each time. Only the head is remembered: what follows it (ThrottleTimeMs; from v3
        #: the tag section, whose FinalizedFeaturesEpoch a KRaft broker takes from its metadata log's offset, which
        #: moves every metadata.max.idle.interval.ms, 500 ms by default, KIP-835) is relayed as the broker wrote it
        self._memo: dict[tuple[int, bytes], tuple[bytes, list[tuple[int, int, int]]]] = {}
        #: per version, the sizes of the heads remembered (one per kind of broker: nearly always one)
        self._head_sizes: dict[int, set[int]] = {}

    def composed(self, chain: Sequence[Policy]) -> None:
        """Offer clients, per API, only the versions every policy of the chain reads
        (:func:`~proxy.core.policy.versions_read`) on top of what the codecs decode or relay."""
        self._read = versions_read(chain)
        self._memo.clear()
        self._head_sizes.clear()

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        h = ex.header
        if h.api_version > self._high:
            ex.answer = local_response(ApiKey.API_VERSIONS, 0, h.correlation_id, unsupported_api_versions_body())
            return None
        ex.collect = True
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        """Cap the broker's ranges (:func:`~proxy.wire.versions.intersect`). The capped head of a broker head seen
        before is remembered: the response's frame becomes its correlation id (ApiVersions answers with header v0
        in every version, KIP-511), that head's answer and the rest of the broker's body, undecoded, as any relayed
        frame. A body starting with the bytes of a head decoded before holds that head (decoding is determined by
        the bytes read), so a lookup needs no decoding."""
        assert isinstance(response, MessageResponse)
        version = response.version
        body = memoryview(response.frame)[4:]
        for size in self._head_sizes.get(version, ()):
            known = self._memo.get((version, bytes(body[:size])))
            if known is not None:
                answer, withheld = known
                response.replace_body(answer + body[size:])
                break
        else:
            codec = head_codec(response_spec(ApiKey.API_VERSIONS), version, _HEAD_LAST_FIELD)
            stream = io.BytesIO(body)
            head = codec.decode_from(stream)
            capped, withheld = intersect(head, self._read)
            if head.error_code:  # not remembered: read whole, its error code reaches the access log
                response.body.api_keys = capped.api_keys
                response.changed = True
            else:
                size = stream.tell()
                answer = codec.encode(capped)
                if len(self._memo) >= MEMO_ENTRIES:
                    self._memo.clear()
                    self._head_sizes.clear()
                self._memo[version, bytes(body[:size])] = answer, withheld
                self._head_sizes.setdefault(version, set()).add(size)
                response.replace_body(answer + body[size:])
        for api_key, low, high in withheld:
            name = api_name(api_key)
            self.metrics.api_withheld.labels(api=name).inc()
            if api_key not in self._logged:
                self._logged.add(api_key)
                ours = offered(api_key, self._read)
                _log.warning("api_withheld", api=name, api_key=api_key, broker_versions=f"{low}-{high}",
                             sluice_versions=f"{ours.low}-{ours.high}" if ours else None, client_id=ex.client_id)
