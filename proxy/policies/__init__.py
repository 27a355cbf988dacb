"""Sans-IO policies over decoded messages, one module each, and the one place they are registered.

:func:`build` lists the chain's policies in order, client side first: requests go through them top to bottom
(towards the broker), responses bottom to top (see :mod:`proxy.core.chain`). Adding a policy is a module here
(a :class:`~proxy.core.policy.Policy`) and one line below.
"""

from __future__ import annotations

from ..config import Settings
from ..core.policy import Policy, Services, versions_read
from .addresses import Addresses
from .api_versions import ApiVersions
from .sasl import Sasl
from .sharing import Sharing
from .size_limit import SizeLimit
from .terminate import Terminate
from .throttle import Throttle


def build(settings: Settings, services: Services) -> list[Policy]:
    """The policies of one proxy, in chain order."""
    api_versions = ApiVersions(services)
    policies: list[Policy] = [
        Sasl(services),  # SASL relayed untouched; the accepted principal's name becomes the connection's
        api_versions,  # clients negotiate only versions Sluice reads
        Addresses(services),  # clients never learn a broker's real address
        SizeLimit(settings.size_limit, services),  # KIP-74 byte budgets
        Throttle(settings.throttle, services),  # KIP-73 replication throttles
        Sharing(settings.sharing, services),  # cooperative consumption: consumers share partitions by key-hash slice
        Terminate(settings.sessions, services),  # KIP-227: Sluice owns the fetch sessions (next to the broker)
    ]
    api_versions.offer(versions_read(policies))  # per API, only the versions every policy on it reads
    return policies
