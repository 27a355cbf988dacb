"""Sluice's operational log during the test session: through the standard library's logging, where pytest
captures it per test and shows it only when the test fails.

By default structlog prints to stdout; a proxy running on its own thread (rig/proxy_thread.py) may log between
two tests, outside pytest's capture, and the line lands in the middle of the progress dots. Routed through
``logging`` with a NullHandler on the ``sluice`` loggers, such a line goes to pytest's handler during a test and
nowhere between tests (no "last resort" printing to stderr).
"""

from __future__ import annotations

import logging

import structlog


def route_sluice_logs_to_pytest() -> None:
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.dev.ConsoleRenderer(colors=False)],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    sluice = logging.getLogger("sluice")
    if not any(isinstance(h, logging.NullHandler) for h in sluice.handlers):
        sluice.addHandler(logging.NullHandler())
