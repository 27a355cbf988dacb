"""The report as one self-contained HTML file: inline CSS, charts as ``data:image/png;base64`` images, no script,
no external resource - it opens from a mail attachment or an artifact store as it is.

Everything taken from the logs (client ids, listener names, malformed lines) is untrusted text and is escaped
here, in one place: sections hold plain text, never markup.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.analytics.drawing import Drawing

__all__ = ["Chart", "Section", "Table", "render"]

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #1d2330; line-height: 1.45; padding: 0 16px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 2px solid #dde3ee; padding-bottom: 4px; margin-top: 2em; }
p.meta { color: #5a6478; margin-top: 0; }
p.nodata { color: #8a5a00; background: #fff6e0; padding: 6px 10px; border-radius: 4px; }
img { display: block; max-width: 100%; height: auto; margin: 12px 0; border: 1px solid #e5e9f0; }
table { border-collapse: collapse; margin: 10px 0 18px; font-size: 0.88em; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border: 1px solid #dde3ee; padding: 3px 8px; text-align: right; }
th { background: #f2f5fa; }
td.text, th.text { text-align: left; }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 0.9em; }
pre { background: #f6f8fb; padding: 8px; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
nav a { margin-right: 12px; }
"""


@dataclass(frozen=True)
class Chart:
    alt: str
    #: the PNG, or the chart still being drawn by :mod:`.drawing`'s worker
    png: bytes | Drawing


@dataclass(frozen=True)
class Table:
    caption: str
    columns: Sequence[str]
    rows: Sequence[Sequence[object]]
    text_columns: int = 1  # the first N columns are left-aligned labels, the rest right-aligned figures


@dataclass
class Section:
    anchor: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    no_data: str | None = None  # shown instead of charts/tables when the logs lack what the section needs
    pre_caption: str | None = None  # introduces the preformatted blocks, which come last
    preformatted: list[str] = field(default_factory=list)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _table(t: Table) -> str:
    def cls(i: int) -> str:
        return ' class="text"' if i < t.text_columns else ""

    head = "".join(f"<th{cls(i)}>{html.escape(c)}</th>" for i, c in enumerate(t.columns))
    body = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{html.escape(_cell(v))}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in t.rows
    )
    return f"<table><caption>{html.escape(t.caption)}</caption><tr>{head}</tr>{body}</table>"


def _chart(c: Chart) -> str:
    data = base64.b64encode(c.png if isinstance(c.png, bytes) else c.png.png()).decode("ascii")
    return f'<img alt="{html.escape(c.alt, quote=True)}" src="data:image/png;base64,{data}">'


def render(title: str, meta: str, sections: Sequence[Section]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">{html.escape(meta)}</p>',
        "<nav>"
        + "".join(f'<a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a>' for s in sections)
        + "</nav>",
    ]
    for s in sections:
        parts.append(f'<section id="{html.escape(s.anchor)}"><h2>{html.escape(s.title)}</h2>')
        parts.extend(f"<p>{html.escape(p)}</p>" for p in s.paragraphs)
        if s.no_data is not None:
            parts.append(f'<p class="nodata">{html.escape(s.no_data)}</p>')
        parts.extend(_chart(c) for c in s.charts)
        parts.extend(_table(t) for t in s.tables)
        if s.pre_caption is not None:
            parts.append(f"<p>{html.escape(s.pre_caption)}</p>")
        parts.extend(f"<pre>{html.escape(p)}</pre>" for p in s.preformatted)
        parts.append("</section>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
