"""The Grafana dashboard (config/grafana/dashboards/sluice.json) as the tests read it, and its PromQL made runnable
without Grafana.

Grafana cannot be installed on the test machines, so the tests take each panel's query and evaluate it in a real
Prometheus themselves, after doing what Grafana does before it sends a query:

- the datasource (``${datasource}``) only picks which Prometheus receives the query: it never appears in PromQL;
- ``$job`` and ``$instance`` become ``.+``, what their "All" option sends (``allValue``);
- ``$__rate_interval`` becomes ``1m``: Grafana's value for it is max(4 x the data source's scrape interval,
  $__interval + scrape interval), i.e. 1m with the compose stack's 15 s scrape (config/grafana/provisioning);
  against the test's 1 s scrape any range of 2 s or more holds the two samples rate() needs;
- ``$__interval`` becomes ``15s`` and ``$__range`` ``1h`` (the dashboard's default time range).

A variable the table does not know is left in the query and fails the test that evaluates it: add it here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "config" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "sluice.json"
GENERATOR = GRAFANA / "dashboard.py"

#: Grafana's variables -> what Grafana sends for them (see the module docstring); longest names first
SUBSTITUTIONS: dict[str, str] = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$instance": ".+",
    "$job": ".+",
}


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def load_generator() -> ModuleType:
    """config/grafana/dashboard.py as a module (it is a script next to the JSON, not part of a package)."""
    spec = importlib.util.spec_from_file_location("sluice_grafana_dashboard", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def data_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows are only headings), including panels inside collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL as written) for every target of every data panel."""
    return [(p["title"], t["expr"]) for p in data_panels(dashboard) for t in p["targets"]]


def variable_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """name -> query of every Prometheus query variable (``label_values(...)``)."""
    out = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out[var["name"]] = query["query"] if isinstance(query, dict) else query
    return out


def substitute(promql: str) -> str:
    """``promql`` with Grafana's variables replaced as Grafana would (module docstring)."""
    for name, value in SUBSTITUTIONS.items():
        promql = promql.replace(name, value)
    return promql


_LABEL_VALUES = re.compile(r"^label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>\w+)\s*\)$")


def parse_label_values(query: str) -> tuple[str | None, str]:
    """``label_values(series, label)`` -> (series selector or None, label)."""
    m = _LABEL_VALUES.match(query.strip())
    assert m, f"not a label_values() query: {query}"
    return m.group("match"), m.group("label")
