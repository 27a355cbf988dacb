"""The README and the getting-started page as a new user reads them: what `make run` prints is what they show, the
README's links stay inside the repository and resolve, the make targets they name exist, and they say what `make
install` installs with apt. (The documentation site's own links and anchors: `make docs`, mkdocs build --strict.)"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from rig.kafka import KafkaBroker
from rig.run import DEFAULT_METRICS_URL, DEFAULT_PROXY_BOOTSTRAP, _banner

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
GETTING_STARTED = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


@pytest.mark.parametrize(("page", "shown_lines"), [(README, 4), (GETTING_STARTED, 6)])
def test_make_run_banner_is_what_the_pages_show(page: str, shown_lines: int) -> None:
    shown = _section(page, "The two commands").split("`make run` prints where to connect", 1)[1]
    block = shown.split("```\n", 2)[1].rstrip("\n").splitlines()
    broker = SimpleNamespace(bootstrap="127.0.0.1:40123", node_id=1, libs_dir=Path("/opt/kafka/libs"),
                             log_path=Path("/tmp/sluice-kafka-5e6f7a8b/broker.log"))
    banner = _banner(cast(KafkaBroker, broker), DEFAULT_PROXY_BOOTSTRAP, DEFAULT_METRICS_URL,
                     Path("/tmp/sluice-run-1a2b3c4d/sluice.log"), stream_logs=False)
    assert block == banner.strip("\n").splitlines()[: len(block)]
    assert len(block) >= shown_lines  # the header, where to connect (and, on the full page, both logs)


def test_links_point_inside_the_repository_and_resolve() -> None:
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"(?m)^#+ (.+)$", README)}
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert links
    for link in links:
        assert "://" not in link and not link.startswith(("/", "..")), f"{link}: not inside the repository"
        path, _, anchor = link.partition("#")
        if path:
            assert (REPO / path).exists(), f"{link}: no such file in the repository"
        else:
            assert anchor in anchors, f"{link}: no such heading"


def test_make_targets_named_in_the_readme_exist() -> None:
    named = set(re.findall(r"`make ([a-z][a-z-]*)", README + GETTING_STARTED))
    assert {"run", "test", "install", "test-image", "docs", "bench-smoke"} <= named
    for target in named:
        assert re.search(rf"(?m)^{re.escape(target)}:", MAKEFILE), f"make {target}: no such target"


def test_readme_says_what_make_install_installs_with_apt_and_that_it_needs_root() -> None:
    packages = re.findall(r"apt-get install -y -q --no-install-recommends (\S+);", MAKEFILE)
    assert sorted(packages) == ["chromium", "prometheus"]
    section = _section(GETTING_STARTED, "The two commands")
    for package in packages:
        assert f"`{package}`" in section
    assert "root or `sudo`" in section and "root or `sudo`" in _section(README, "The two commands")


def test_no_stale_claims() -> None:
    assert "Today Sluice is a **transparent proxy**" not in README
    assert "../shared" not in README
