"""ApiVersions: clients negotiate only versions Sluice can read (rules in :mod:`proxy.wire.versions`).

The broker's ranges are capped to what Sluice decodes; an ApiVersions request version Sluice does not know is
answered the way Kafka does (error 35, UNSUPPORTED_VERSION, in the v0 layout, naming the supported range).
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..core.exchange import Exchange
from ..core.policy import Policy
from ..wire.messages import API_VERSIONS_KEY, decoded_versions
from ..wire.versions import intersect, unsupported_api_versions_body
from ..wire.views import MessageResponse, ResponseView, local_response


class ApiVersions(Policy):
    name = "api_versions"
    apis: ClassVar[frozenset[int]] = frozenset({API_VERSIONS_KEY})

    def __init__(self) -> None:
        ours = decoded_versions(API_VERSIONS_KEY)
        assert ours is not None
        self._high = ours.high

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        h = ex.header
        if h.api_version > self._high:
            ex.answer = local_response(API_VERSIONS_KEY, 0, h.correlation_id, unsupported_api_versions_body())
            return None
        ex.collect = True
        return True

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Any) -> None:
        assert isinstance(response, MessageResponse)
        body = response.body
        body.api_keys = intersect(body).api_keys
        response.changed = True
