"""Charts drawn in another process while the report's queries go on.

The charts of a report are matplotlib, drawn from plain lists the job collected: CPU of the driver's process,
between two Spark queries, while the JVM waits for the next one (17 charts, 2.1-2.4 s of a landed report's ~14 s
of wall on two cores). Drawn by a worker process beside the driver, each chart is drawn while the next sections'
queries run; the page waits only for the charts still being drawn when it is written.

The worker is ``python -m proxy.analytics.drawing``, with the driver's ``sys.path``, answering pickled calls on its
stdin with PNG bytes on its stdout (a frame each: the call's number, and its length). Not ``multiprocessing``: the
driver holds py4j's threads and sockets, which a fork would copy half-way, and a "spawn" start runs the driver's
main script again in the worker unless the script guards its code with ``if __name__ == "__main__"`` (a user's
script calling :func:`~proxy.analytics.job.run_job` need not). It is started once per process, when a job starts
(:func:`start`) or at the first chart, and kept for the process's next reports (the tests' reports, a ``sluice
stream``'s live pages); it ends when the driver closes its stdin, at exit. A worker that cannot be started or dies
leaves its charts to the driver, drawn as before: the report is the same either way.
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Any, ParamSpec

__all__ = ["Drawing", "draw", "start"]

P = ParamSpec("P")

#: a call's frame: its number and the length of its pickled (function, args, kwargs)
_CALL = struct.Struct(">QI")
#: an answer's frame: the call's number, 0 (the PNG follows) or 1 (the error's text follows), and the length
_ANSWER = struct.Struct(">QBI")


class WorkerGone(RuntimeError):
    """The worker process ended (or could not be written to) before it answered."""


class _Worker:
    """The worker process, its calls in flight, and the thread reading its answers."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._proc = subprocess.Popen([sys.executable, "-m", "proxy.analytics.drawing"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)
        #: guards the calls in flight; the reading thread takes it too, so no write to the worker is made under it
        self._lock = threading.Lock()
        #: one call's frame written at a time
        self._writing = threading.Lock()
        self._pending: dict[int, Future[bytes]] = {}
        self._next = 0
        self.gone = False
        threading.Thread(target=self._answers, name="sluice-drawing", daemon=True).start()

    def submit(self, call: bytes) -> Future[bytes]:
        done: Future[bytes] = Future()
        with self._lock:
            if self.gone:
                raise WorkerGone("the chart worker ended")
            number, self._next = self._next, self._next + 1
            self._pending[number] = done
        # Written outside ``_lock``: a write blocks while the worker's stdin pipe is full, and the worker reads it
        # only once it has written its answer, which the reading thread takes ``_lock`` to hand over
        stdin = self._proc.stdin
        assert stdin is not None
        with self._writing:
            try:
                stdin.write(_CALL.pack(number, len(call)) + call)
                stdin.flush()
            except (OSError, ValueError) as e:  # ValueError: its stdin closed (close(), at exit)
                with self._lock:
                    self._pending.pop(number, None)
                    self.gone = True
                raise WorkerGone(str(e)) from e
        return done

    def _answers(self) -> None:
        out = self._proc.stdout
        assert out is not None
        while (head := _read(out, _ANSWER.size)) is not None:
            number, status, size = _ANSWER.unpack(head)
            body = _read(out, size)
            if body is None:
                break
            with self._lock:
                done = self._pending.pop(number, None)
            if done is not None:
                if status == 0:
                    done.set_result(body)
                else:
                    done.set_exception(RuntimeError(body.decode(errors="replace")))
        with self._lock:
            self.gone = True
            pending, self._pending = self._pending, {}
        for done in pending.values():
            done.set_exception(WorkerGone("the chart worker ended"))

    def close(self) -> None:
        """Its stdin closed (it then ends), waited for briefly, killed if it does not."""
        with self._lock:
            self.gone = True
        stdin = self._proc.stdin
        try:
            if stdin is not None:
                stdin.close()
            self._proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        """For tests: the worker dies as if killed by the kernel."""
        self._proc.kill()
        self._proc.wait()


_worker: _Worker | None = None
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
            except Exception:
                pass  # not drawn there (the worker died, or the chart failed): drawn here, where an error of the
                # chart's own is raised again
        return self._draw_here()


def draw(chart: Callable[P, bytes], *args: P.args, **kwargs: P.kwargs) -> Drawing:
    """``chart(*args, **kwargs)`` (a function of :mod:`.charts`) drawn by the worker process."""

    def draw_here() -> bytes:
        return chart(*args, **kwargs)

    worker = _running()
    if worker is None:
        return Drawing(draw_here, None)
    try:
        return Drawing(draw_here, worker.submit(pickle.dumps((chart, args, kwargs))))
    except (WorkerGone, pickle.PicklingError, AttributeError, TypeError):  # what pickle raises for what it cannot
        return Drawing(draw_here, None)


def start() -> None:
    """Start the worker now (a job's first step), so that its start and its import of matplotlib overlap the job's
    queries instead of delaying the first chart."""
    _running()


def _running() -> _Worker | None:
    """The worker, started anew if there is none or it ended; None if it cannot be started."""
    global _worker
    with _lock:
        if _worker is None or _worker.gone:
            if _worker is not None:
                _worker.close()
            try:
                _worker = _Worker()
            except OSError:
                _worker = None
        return _worker


@atexit.register
def _stop() -> None:
    with _lock:
        if _worker is not None:
            _worker.close()


def _read(stream: IO[bytes], size: int) -> bytes | None:
    """Exactly ``size`` bytes, or None at the end of the stream."""
    data = stream.read(size)
    return data if len(data) == size else None


def _serve(calls: IO[bytes], answers: IO[bytes]) -> None:
    """The worker's loop: each call answered in turn, until its stdin ends."""
    import proxy.analytics.charts  # noqa: F401 - matplotlib imported before the first call, not during it

    while (head := _read(calls, _CALL.size)) is not None:
        number, size = _CALL.unpack(head)
        body = _read(calls, size)
        if body is None:
            return
        try:
            chart, args, kwargs = pickle.loads(body)
            result: Any = chart(*args, **kwargs)
            status, payload = 0, bytes(result)
        except Exception as e:  # the driver draws it again and raises the chart's own error there
            status, payload = 1, repr(e).encode()
        answers.write(_ANSWER.pack(number, status, len(payload)) + payload)
        answers.flush()


if __name__ == "__main__":
    # The answers go to the stdout the driver reads; anything the libraries print goes to stderr instead
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, answers)
