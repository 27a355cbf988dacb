r"""The vocabulary of Sluice's Grafana dashboard (config/grafana/dashboard.py writes it): a :class:`Row` of
:class:`Panel`\s, each its title, unit, description and PromQL queries. The core's rows are the dashboard script's;
each policy declares its own row in its registration (``Registration.dashboard``), so a policy brings its view with
it. A leaf: it imports nothing of Sluice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DATASOURCE", "FILTER", "RATE", "Panel", "Row", "quantile", "rate", "sel"]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: the filter every selector carries (the job and instance template variables)
FILTER = 'job=~"$job", instance=~"$instance"'
RATE = "$__rate_interval"


def sel(metric: str, labels: str = "") -> str:
    """``metric{labels, job=~"$job", instance=~"$instance"}``."""
    return f"{metric}{{{labels + ', ' if labels else ''}{FILTER}}}"


def rate(metric: str, labels: str = "", by: str = "") -> str:
    """``sum [by (...)] (rate(metric{...}[$__rate_interval]))``."""
    return f"sum{f' by ({by}) ' if by else ''}(rate({sel(metric, labels)}[{RATE}]))"


def quantile(q: float) -> str:
    return (f"histogram_quantile({q}, sum by (api, le) "
            f"(rate({sel('sluice_request_latency_seconds_bucket')}[{RATE}])))")


@dataclass
class Panel:
    title: str
    unit: str
    description: str
    #: (PromQL, legend) pairs
    targets: list[tuple[str, str]]
    width: int = 12
    height: int = 8
    kind: str = "timeseries"
    #: the y axis starts at 0 (not for values that go negative)
    min_zero: bool = True
    #: stat panels: the value from which it turns red (None: always green)
    red_from: float | None = None


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)
