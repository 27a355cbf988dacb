"""Sluice as a real subprocess for tests (signals, Prometheus scraping, psutil). The implementation lives in
``rig/sluice_process.py`` so ``bench/`` shares it without importing the test tree."""

from __future__ import annotations

from rig.sluice_process import SluiceProcess

SubprocessProxy = SluiceProcess

__all__ = ["SubprocessProxy"]
