"""Sluice's own wire specs (proxy/codecs/) ship as package data, are found next to the imported package, and
their absence stops `sluice run` / `sluice check-config` at start-up with exit code 2 and one line naming the
path (never a proxy that starts and then closes every connection). Also `sluice --version`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import proxy
from proxy import cli
from proxy.wire import schema
from proxy.wire.schema import SpecsError, check_specs

REPO = Path(__file__).resolve().parents[2]
SPEC_FILES = ("manifest.json", "RecordBatch.json", "Record.json", "SharingSubscription.json", "SharingAssignment.json",
              "SharingCommitMetadata.json")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("SLUICE_")}


def test_specs_are_found_inside_the_imported_package() -> None:
    directory = check_specs()
    assert directory == Path(proxy.__file__).resolve().parent / "codecs"
    assert all((directory / name).is_file() for name in SPEC_FILES)


def test_a_missing_specs_directory_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "site-packages" / "proxy" / "codecs"
    monkeypatch.setattr(schema, "CODECS_DIR", missing)
    with pytest.raises(SpecsError, match=f"directory {missing} not found"):
        check_specs()


@pytest.mark.parametrize("removed", SPEC_FILES)
def test_a_missing_spec_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, removed: str) -> None:
    copy = tmp_path / "codecs"
    shutil.copytree(schema.CODECS_DIR, copy)
    (copy / removed).unlink()
    monkeypatch.setattr(schema, "CODECS_DIR", copy)
    with pytest.raises(SpecsError, match=f"{copy / removed} not found"):
        check_specs()


def test_an_unreadable_spec_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    copy = tmp_path / "codecs"
    shutil.copytree(schema.CODECS_DIR, copy)
    (copy / "Record.json").write_text("{ not json")
    monkeypatch.setattr(schema, "CODECS_DIR", copy)
    with pytest.raises(SpecsError, match=f"wire spec {copy / 'Record.json'} is unreadable"):
        check_specs()


@pytest.mark.parametrize("argv", [["check-config", "config/sluice.toml"], ["run", "--config", "config/sluice.toml"]])
def test_cli_refuses_to_start_without_specs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    """Both commands stop before any listener opens: exit code 2, one line on stderr naming the path."""
    missing = tmp_path / "nowhere" / "codecs"
    monkeypatch.setattr(schema, "CODECS_DIR", missing)
    monkeypatch.chdir(REPO)
    for key in [k for k in os.environ if k.upper().startswith("SLUICE_")]:
        monkeypatch.delenv(key)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"install error: Sluice's wire specs are missing: directory {missing} not found (they ship inside the "
        "proxy package as package data, proxy/codecs/; reinstall kafka-sluice)"
    ]


def test_version_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "--version"], cwd=REPO, env=clean_env(), capture_output=True, text=True,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == subprocess.run(
        [sys.executable, "-m", "proxy", "version"], cwd=REPO, env=clean_env(), capture_output=True, text=True,
        timeout=60,
    ).stdout
    assert result.stdout.startswith("sluice ") and result.stdout.strip() != "sluice"


def test_build_ships_the_specs_as_package_data(tmp_path: Path) -> None:
    """What setuptools puts into the package (the files a wheel, `pip install .` and the image get), built
    offline from a copy of the project files pyproject.toml reads."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "proxy", src / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "lib"
    result = subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py", "--build-lib", str(out)],
        cwd=src, env=clean_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    shipped = out / "proxy" / "codecs"
    assert sorted(p.name for p in shipped.iterdir()) == sorted([*SPEC_FILES, "README.md"])
    manifest = schema.parse_spec_text((shipped / "manifest.json").read_text())
    assert manifest["sluice"] == ["RecordBatch", "Record", "SharingSubscription", "SharingAssignment",
                                  "SharingCommitMetadata"]
