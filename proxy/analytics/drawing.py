"""Charts drawn in another process while the report's queries go on.

The charts of a report are matplotlib, drawn from plain lists the job collected: CPU of the driver's process,
between two Spark queries, while the JVM waits for the next one (17 charts, 2.1-2.4 s of a landed report's ~14 s
of wall on two cores). Drawn by a worker process beside the driver, each chart is drawn while the next sections'
queries run; the page waits only for the charts still being drawn when it is written.

The worker is started with "spawn", not a fork: the driver holds py4j's threads and sockets, which a fork would
copy half-way. It is started once per process, when a job starts (:func:`start`) or at the first chart, and kept
for the process's next reports (the tests' reports, a ``sluice stream``'s live pages), ended at exit by
:mod:`concurrent.futures`. A worker that cannot be started or dies leaves its charts to the driver, drawn as
before: the report is the same either way.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import ParamSpec

__all__ = ["Drawing", "draw", "start"]

P = ParamSpec("P")

_pool: ProcessPoolExecutor | None = None
_lock = threading.Lock()


class Drawing:
    """A chart being drawn: its PNG bytes when :meth:`png` is asked, drawn by the worker or, if the worker
    failed, here."""

    def __init__(self, draw_here: Callable[[], bytes], future: Future[bytes] | None) -> None:
        self._draw_here = draw_here
        self._future = future

    def png(self) -> bytes:
        if self._future is not None:
            try:
                return self._future.result()
            except BrokenProcessPool:
                _broken()
            except Exception:
                pass  # not drawn there (its arguments could not be pickled, ...): drawn here, where an error of
                # the chart's own is raised again
        return self._draw_here()


def draw(chart: Callable[P, bytes], *args: P.args, **kwargs: P.kwargs) -> Drawing:
    """``chart(*args, **kwargs)`` (a function of :mod:`.charts`) drawn by the worker process."""

    def draw_here() -> bytes:
        return chart(*args, **kwargs)

    pool = _worker()
    if pool is None:
        return Drawing(draw_here, None)
    try:
        return Drawing(draw_here, pool.submit(chart, *args, **kwargs))
    except (BrokenProcessPool, RuntimeError):  # RuntimeError: the interpreter is shutting down
        _broken()
        return Drawing(draw_here, None)


def start() -> None:
    """Start the worker now (a job's first step), so that its start and its import of matplotlib overlap the job's
    queries instead of delaying the first chart."""
    pool = _worker()
    if pool is not None:
        try:
            pool.submit(_import_charts)
        except (BrokenProcessPool, RuntimeError):
            _broken()


def _import_charts() -> None:
    """In the worker: the charts' module, and matplotlib with it."""
    import proxy.analytics.charts  # noqa: F401


def _worker() -> ProcessPoolExecutor | None:
    global _pool
    with _lock:
        if _pool is None:
            try:
                _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            except OSError:
                return None
        return _pool


def _broken() -> None:
    """The worker died: the next chart starts another."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
