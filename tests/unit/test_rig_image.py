"""rig/image.py's pure parts (`make test-image` itself runs Podman and is CI's job): which base images the
Dockerfile and docker-compose.yml need, their Docker Hub names, and that each has a stand-in recipe."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rig import image


def test_needed_images_are_the_bases_the_files_name() -> None:
    needed = image.needed_images()
    assert "python:3.11-slim" in needed
    assert any(n.startswith("apache/kafka:") for n in needed)
    assert any(n.startswith("prom/prometheus:") for n in needed)
    assert image.SLUICE_IMAGE not in needed  # built, not pulled
    assert f"image: {image.SLUICE_IMAGE}" in image.COMPOSE_FILE.read_text()


@pytest.mark.parametrize(("name", "full"), [
    ("python:3.11-slim", "docker.io/library/python:3.11-slim"),
    ("apache/kafka:4.1.2", "docker.io/apache/kafka:4.1.2"),
    ("docker.io/prom/prometheus:v3.5.0", "docker.io/prom/prometheus:v3.5.0"),
    ("localhost/sluice-standin/debian:bookworm", "localhost/sluice-standin/debian:bookworm"),
    ("quay.io/x/y:1", "quay.io/x/y:1"),
])
def test_qualified_names(name: str, full: str) -> None:
    assert image.qualified(name) == full


def test_every_needed_image_has_a_standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "kafka_2.13-4.1.2.jar").write_bytes(b"jar")
    versions: list[str] = []

    def find_libs(version: str) -> Path:
        versions.append(version)
        return libs

    monkeypatch.setattr(image, "find_libs", find_libs)
    for name in image.needed_images():
        standin = image.prepare_standin(name, tmp_path / "work")
        assert (standin.context / "Containerfile").is_file()
        assert "FROM " + image.DEBIAN_BASE in (standin.context / "Containerfile").read_text()
    kafka_tag = next(n for n in image.needed_images() if n.startswith("apache/kafka:")).split(":")[1]
    assert versions == [kafka_tag]  # the jars of the image's own version
    assert (tmp_path / "work" / "kafka" / "libs" / "kafka_2.13-4.1.2.jar").read_bytes() == b"jar"
    with pytest.raises(image.ImageTestError, match="no stand-in"):
        image.prepare_standin("redis:7", tmp_path / "other")


def test_a_base_image_is_real_when_a_registry_answers_even_with_a_standin_cached() -> None:
    """A real image is kept without asking the registry; a stand-in cached on a day no registry answered, or no
    image at all, is replaced by the real one when the registry answers now, and kept (or built) when it does not."""
    asked: list[bool] = []

    def registry(answers: bool) -> Callable[[], bool]:
        def probe() -> bool:
            asked.append(answers)
            return answers
        return probe

    assert image.base_image_source("", registry(True)) == "present" and asked == []
    assert image.base_image_source("abc123", registry(True)) == "pull"
    assert image.base_image_source(None, registry(True)) == "pull"
    assert image.base_image_source("abc123", registry(False)) == "standin"
    assert image.base_image_source(None, registry(False)) == "standin"
    assert asked == [True, True, False, False]
