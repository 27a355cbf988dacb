"""The README as a new user reads it: what `make run` prints is what it shows, its links stay inside the
repository and resolve, the make targets it names exist, and it says what `make install` installs with apt."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from rig.kafka import KafkaBroker
from rig.run import DEFAULT_METRICS_URL, DEFAULT_PROXY_BOOTSTRAP, _banner

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_make_run_banner_is_what_the_readme_shows() -> None:
    shown = _section("The two commands").split("`make run` prints where to connect", 1)[1]
    block = shown.split("```\n", 2)[1].rstrip("\n").splitlines()
    broker = SimpleNamespace(bootstrap="127.0.0.1:40123", node_id=1, libs_dir=Path("/opt/kafka/libs"),
                             log_path=Path("/tmp/sluice-kafka-5e6f7a8b/broker.log"))
    banner = _banner(cast(KafkaBroker, broker), DEFAULT_PROXY_BOOTSTRAP, DEFAULT_METRICS_URL,
                     Path("/tmp/sluice-run-1a2b3c4d/sluice.log"), stream_logs=False)
    assert block == banner.strip("\n").splitlines()[: len(block)]
    assert len(block) >= 6  # the header, where to connect, and both logs


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
    named = set(re.findall(r"`make ([a-z][a-z-]*)", README))
    assert {"run", "test", "install", "test-image"} <= named
    for target in named:
        assert re.search(rf"(?m)^{re.escape(target)}:", MAKEFILE), f"make {target}: no such target"


def test_readme_says_what_make_install_installs_with_apt_and_that_it_needs_root() -> None:
    packages = re.findall(r"apt-get install -y -q --no-install-recommends (\S+);", MAKEFILE)
    assert sorted(packages) == ["chromium", "prometheus"]
    section = _section("The two commands")
    for package in packages:
        assert f"`{package}`" in section
    assert "root or `sudo`" in section


def test_no_stale_claims() -> None:
    assert "Today Sluice is a **transparent proxy**" not in README
    assert "../shared" not in README
