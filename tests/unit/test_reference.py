"""The references the documentation takes from the code (proxy/reference.py) are the code's: the committed pages
are exactly what ``python -m proxy.reference docs/reference`` writes, and they name what the code defines."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.app import DYNAMIC_SECTIONS, REGISTRY
from proxy.reference import PAGES, access_log_markdown, configuration_markdown, metrics_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_committed_page_is_what_the_code_writes(page: str) -> None:
    assert (DOCS / page).read_text() == PAGES[page](), f"run: python -m proxy.reference docs/reference ({page})"


def test_every_section_key_field_and_metric_is_listed() -> None:
    config = configuration_markdown()
    for registration in REGISTRY:
        if registration.section:
            assert f"\n## {registration.section}\n" in config
    for section in DYNAMIC_SECTIONS:
        assert f"## {section}\n\n*a policy's section; changeable at run time" in config
    assert "| `bootstrap_servers` | list of string | `['127.0.0.1:9092']` |" in config
    fields = access_log_markdown()
    for registration in REGISTRY:
        for name in registration.log_fields:
            assert f"| `{name}` |" in fields
    assert "| `sluice_requests_total` | counter |" in metrics_markdown()
