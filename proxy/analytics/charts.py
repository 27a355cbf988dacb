"""Charts as PNG bytes (matplotlib, Agg), from plain Python lists the job collected.

Figures are built with ``matplotlib.figure.Figure`` directly, never pyplot: no global figure registry to leak
into, no GUI backend picked from the environment (a headless CI box has no display), and the Agg canvas is what
``savefig`` uses for PNG anyway. Labels come from the logs (client ids are chosen by clients), so mathtext
parsing is off - a client id containing ``$`` would otherwise be typeset or fail to render - and long labels are
shortened.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import matplotlib
import matplotlib.dates as mdates
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator

from proxy.analytics.units import fmt_bytes

__all__ = ["bars", "grouped_bars", "time_series"]

WIDTH_IN = 10.0
HEIGHT_IN = 3.6
DPI = 100
LABEL_CHARS = 40
# dict[Any, Any]: matplotlib types rc keys as a Literal union; these are all valid keys.
_RC: dict[Any, Any] = {
    "text.parse_math": False,
    "font.size": 9,
    "axes.titlesize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def _label(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "\u2026"


class _BinaryLocator(Locator):
    """Ticks at round numbers of the binary unit the axis reaches (0, 256 KiB, 512 KiB, ...), so byte labels read
    "512 KiB" rather than "488 KiB" (what round decimal ticks print as in binary units)."""

    def __init__(self) -> None:
        self._inner = MaxNLocator(nbins=6, steps=[1, 2, 2.5, 4, 5, 8, 10])

    def __call__(self) -> Any:
        assert self.axis is not None
        vmin, vmax = self.axis.get_view_interval()
        return self.tick_values(vmin, vmax)

    def tick_values(self, vmin: float, vmax: float) -> Any:
        top = max(abs(vmin), abs(vmax), 1.0)
        unit = 1024 ** min(4, int(math.log(top, 1024)))
        return self._inner.tick_values(vmin / unit, vmax / unit) * unit


def _format_axis(axis: Axis, unit: str, log: bool) -> None:
    """Tick labels as plain text: "1.5 GiB/s" on byte axes, "100" rather than mathtext 10^2 on log axes (mathtext
    is off, see above)."""
    if unit.startswith("bytes"):
        suffix = unit[len("bytes") :]
        if not log:
            axis.set_major_locator(_BinaryLocator())
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{fmt_bytes(v)}{suffix}" if v else "0"))
    elif log:
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _new(title: str, height_in: float = HEIGHT_IN) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    return fig, ax


def time_series(
    title: str,
    times: Sequence[datetime],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    stacked: bool = False,
    hlines: Mapping[str, float] | None = None,
) -> bytes:
    """One line (or stacked area) per series over ``times`` (UTC); ``hlines``: labelled horizontal references.
    A ``ylabel`` starting with "bytes" gets byte-formatted ticks (and so does ``bars``' ``xlabel``)."""
    with matplotlib.rc_context(_RC):
        fig, ax = _new(title)
        labels = [_label(k) for k in series]
        x = mdates.date2num(list(times))  # matplotlib's date numbers; the axis below formats them as UTC dates
        if stacked and series:
            ax.stackplot(x, *[list(v) for v in series.values()], labels=labels, alpha=0.85)
        else:
            for label, values in zip(labels, series.values(), strict=True):
                ax.plot(x, list(values), label=label, linewidth=1.4, marker="." if len(times) < 30 else "")
        for label, y in (hlines or {}).items():
            ax.axhline(y, linestyle="--", linewidth=1.2, color="black", alpha=0.7, label=_label(label))
        if len(x) == 1:  # one point: matplotlib would pick a range of years around it
            ax.set_xlim(x[0] - 1 / 1440, x[0] + 1 / 1440)  # date numbers are days: +-1 minute
        ax.xaxis_date(tz="UTC")
        locator = mdates.AutoDateLocator(tz="UTC")
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz="UTC"))
        ax.set_ylabel(ylabel)
        _format_axis(ax.yaxis, ylabel, log=False)
        ax.set_xlabel("time (UTC)")
        ax.set_ylim(bottom=0)
        if series or hlines:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        return _png(fig)


def bars(title: str, labels: Sequence[str], values: Sequence[float], *, xlabel: str, log: bool = False) -> bytes:
    """Horizontal bars, first label on top (pass them sorted, largest first)."""
    height = max(2.2, 0.6 + 0.28 * len(labels))
    with matplotlib.rc_context(_RC):
        fig, ax = _new(title, height)
        y = list(range(len(labels)))
        ax.barh(y, list(values), color="#4C72B0")
        ax.set_yticks(y, [_label(s) for s in labels])
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        log = log and any(v > 0 for v in values)
        if log:
            ax.set_xscale("log")
        _format_axis(ax.xaxis, xlabel, log)
        return _png(fig)


def grouped_bars(
    title: str, labels: Sequence[str], groups: Mapping[str, Sequence[float]], *, ylabel: str, log: bool = False
) -> bytes:
    """Vertical bars, one group per label, one bar per key of ``groups`` (e.g. p50/p95/p99 per API)."""
    with matplotlib.rc_context(_RC):
        fig, ax = _new(title)
        n = max(1, len(groups))
        width = 0.8 / n
        for i, (name, values) in enumerate(groups.items()):
            xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
            ax.bar(xs, list(values), width=width, label=name)
        ax.set_xticks(list(range(len(labels))), [_label(s) for s in labels], rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        log = log and any(v > 0 for vs in groups.values() for v in vs)
        if log:
            ax.set_yscale("log")
        _format_axis(ax.yaxis, ylabel, log)
        if groups:
            ax.legend(fontsize=8, frameon=False)
        return _png(fig)
