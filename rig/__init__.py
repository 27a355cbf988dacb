"""The test rig: real Apache Kafka 4.x brokers (KRaft: one node, or N brokers and a controller in cluster.py),
Kafka's Java client tools, Sluice in-process and as a subprocess, real client consumers, the raw Kafka client
(raw.py), the Fetch oracles, spec-generated messages, the sans-IO chain and core rigs and the fuzz targets: the
support code tests and benches share.

The rule: rig/ holds what runs real parts (brokers, clusters, Sluice, clients) or is used by benches as well as
tests; tests/support/ holds test-only helpers and checks. rig/ never imports tests/ (benches must not depend on
the test tree), nor a private (``_name``) of a production module; no module name is in both places.

Tests, benches and `make run` get Kafka from here, never from a mock. See ARCHITECTURE.md ("Layout", rig/).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rig.java_tools import JavaTools as JavaTools
    from rig.java_tools import PerfResult as PerfResult
    from rig.kafka import KAFKA_VERSION as KAFKA_VERSION
    from rig.kafka import KafkaBroker as KafkaBroker
    from rig.kafka import RigError as RigError
    from rig.kafka import find_java as find_java
    from rig.kafka import find_libs as find_libs

# Names are imported lazily (PEP 562) so that `python -m rig.kafka` does not import rig.kafka twice (once via
# this package, once as __main__), which would give two atexit registries and a runpy warning.
_EXPORTS = {
    "KAFKA_VERSION": "rig.kafka",
    "KafkaBroker": "rig.kafka",
    "RigError": "rig.kafka",
    "find_java": "rig.kafka",
    "find_libs": "rig.kafka",
    "JavaTools": "rig.java_tools",
    "PerfResult": "rig.java_tools",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rig' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
