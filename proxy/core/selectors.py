"""Client selectors: which client connections a rule of a policy's section (a budget, a throttled consumer, an
entity's quota) applies to. Sans-IO. A selector names any of three things about a request, and all it names must match:

- ``client_id``: a glob over the request header's client.id (fnmatch, case-sensitive), chosen by the client;
- ``principal``: a glob over the SASL principal the broker accepted on the connection
  (:mod:`proxy.core.sasl_principal`): who the client proved to be; a connection without one never matches;
- ``network``: the client's IP address in a network (``10.1.0.0/16``, or one address): the PROXY protocol
  header's source on listeners that read one, else the peer's.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClientSelector"]

#: answers a selector remembers (client.ids are the clients' to choose: the memory is bounded, and starts over
#: when full)
_SEEN_MAX = 4096


@dataclass(frozen=True, slots=True)
class ClientSelector:
    client_id: str | None = None
    principal: str | None = None
    network: str | None = None
    _net: Any = field(init=False, repr=False, compare=False, default=None)
    #: (client.id, principal, address) -> the answer: a selector is asked on every request of the APIs its policy
    #: reads, by the same few clients, and a glob match costs far more than a look-up
    _seen: dict[tuple[str | None, str | None, str], bool] = field(init=False, repr=False, compare=False,
                                                                   default_factory=dict)

    def __post_init__(self) -> None:
        if self.network is not None:
            object.__setattr__(self, "_net", ipaddress.ip_network(self.network, strict=False))

    @classmethod
    def of(cls, entry: Any) -> ClientSelector:
        """From a settings entry with ``client_id``, ``principal`` and ``client_address`` keys."""
        return cls(entry.client_id, entry.principal, entry.client_address)

    def matches(self, client_id: str | None, principal: str | None = None, host: str = "") -> bool:
        key = (client_id, principal, host)
        seen = self._seen
        answer = seen.get(key)
        if answer is None:
            if len(seen) >= _SEEN_MAX:
                seen.clear()
            answer = seen[key] = self._matches(client_id, principal, host)
        return answer

    def _matches(self, client_id: str | None, principal: str | None, host: str) -> bool:
        if self.client_id is not None and not fnmatch.fnmatchcase(client_id or "", self.client_id):
            return False
        if self.principal is not None and (principal is None or not fnmatch.fnmatchcase(principal, self.principal)):
            return False
        if self._net is not None:
            try:
                addr = ipaddress.ip_address(host)
            except ValueError:
                return False
            if addr not in self._net:
                return False
        return True
