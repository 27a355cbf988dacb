"""Another revision's code beside this checkout, for the benches' ``--compare REV`` (before and after a change in one
run): its packages extracted with ``git archive`` into a directory (nothing of this checkout's working tree is
touched; the running process keeps importing this checkout's code)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPO", "extract_revision", "short_revision"]

REPO = Path(__file__).resolve().parents[2]


def extract_revision(rev: str, into: Path, paths: Sequence[str] = ("proxy",)) -> str:
    """REV's ``paths`` (top-level packages) under ``into``; returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, *paths], check=True,
                         capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return commit


def short_revision(rev: str) -> str:
    """``rev`` as git abbreviates it (for labels)."""
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True, text=True,
                          check=True).stdout.strip()
