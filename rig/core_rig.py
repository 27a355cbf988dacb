"""The sans-IO connection core (proxy/core/connection.py) driven by hand: a fake :class:`~proxy.core.connection.Port`
that records every action, timers on the fake clock, and a rig holding what a proxy's connections share.

No event loop, no sockets, no sleeps: a test feeds events to a :class:`~proxy.core.connection.Connection`
(``client_data``, ``upstream_data``, ...), moves the clock with :meth:`CoreRig.advance` (timers due by then fire,
in deadline order) and checks what each side received, the port actions, the metrics and the access log.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import Any

from proxy.accesslog import AccessLog
from proxy.core.connection import Connection, Limits
from proxy.core.exchange import Buffer, ConnectionInfo
from proxy.core.memory import HeldBytes
from proxy.core.observer import ConnectionEvents
from proxy.wire.messages import encode_request, encode_response, request_codec, response_codec
from proxy.wire.model import Message
from rig.chain_rig import Clock, SansIOProxy


class FakeTimer:
    """A timer of :class:`Timers`: fires at ``when`` on the fake clock unless cancelled."""

    __slots__ = ("callback", "cancelled", "fired", "seq", "when")

    def __init__(self, when: float, seq: int, callback: Callable[[], None]) -> None:
        self.when = when
        self.seq = seq
        self.callback = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """``call_later`` on the fake clock. Nothing fires by itself: :meth:`advance` moves the clock and fires every
    timer due by then, earliest first (ties in creation order), with the clock set to each timer's deadline, like
    an event loop that is never late; timers those callbacks start fire too when due within the advance."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._timers: list[FakeTimer] = []
        self._seq = 0

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        assert delay >= 0, f"negative timer delay {delay}"
        self._seq += 1
        timer = FakeTimer(self.clock.now + delay, self._seq, callback)
        self._timers.append(timer)
        return timer

    @property
    def pending(self) -> list[FakeTimer]:
        """Timers neither fired nor cancelled, earliest first."""
        return sorted((t for t in self._timers if not (t.cancelled or t.fired)), key=lambda t: (t.when, t.seq))

    def advance(self, seconds: float) -> None:
        target = self.clock.now + seconds
        while True:
            due = [t for t in self.pending if t.when <= target]
            if not due:
                break
            timer = due[0]
            self.clock.now = max(self.clock.now, timer.when)
            timer.fired = True
            timer.callback()
        self.clock.now = target


#: port actions that must not happen once the connection is closed (the server would drop them)
LATE = frozenset({"send_client", "send_upstream", "call_later"})


class FakePort:
    """A :class:`~proxy.core.connection.Port` that records every action, in order, and what each side got.

    ``actions`` holds ``(name, argument)`` pairs: ``("send_client", bytes)``, ``("send_upstream", bytes)``,
    ``("pause_client", None)``, ``("resume_client", None)``, ``("pause_upstream", None)``,
    ``("resume_upstream", None)``, ``("close", abort)``, ``("call_later", delay)``, ``("read_upstream_into",
    on)``, ``("defer", None)``. ``defer`` calls back at once unless ``put_off``: then its callbacks wait for
    :meth:`turn`, as for an event loop's next turn. Bytes sent are copied at once (the core may hand out views of
    buffers it reuses). ``late`` lists sends and timers asked for after the connection was closed (by the core, or
    by the test through :meth:`gone`). :meth:`deliver` hands upstream bytes to the core as a transport does,
    reading into the core's buffer while it asked for that (a test may also call ``Connection.upstream_data``
    itself: the core takes either)."""

    def __init__(self, timers: Timers, *, put_off: bool = False) -> None:
        self.timers = timers
        self.put_off = put_off
        self.deferred: list[Callable[[], None]] = []
        self.actions: list[tuple[str, Any]] = []
        self.client = bytearray()
        self.upstream = bytearray()
        self.client_paused = False
        self.upstream_paused = False
        self.closed: bool | None = None  # None: open; else the abort flag of the close
        self.lost = False  # the test said the client went away (client_lost)
        self.late: list[tuple[str, Any]] = []
        self.reading_into = False  # read_upstream_into is on

    def _record(self, name: str, arg: Any = None) -> None:
        if name in LATE and (self.closed is not None or self.lost):
            self.late.append((name, arg))
        self.actions.append((name, arg))

    def send_client(self, buffers: Sequence[Buffer]) -> None:
        data = b"".join(bytes(b) for b in buffers)
        self._record("send_client", data)
        self.client += data

    def send_upstream(self, buffers: Sequence[Buffer]) -> None:
        data = b"".join(bytes(b) for b in buffers)
        self._record("send_upstream", data)
        self.upstream += data

    def pause_client(self) -> None:
        self._record("pause_client")
        self.client_paused = True

    def resume_client(self) -> None:
        self._record("resume_client")
        self.client_paused = False

    def pause_upstream(self) -> None:
        self._record("pause_upstream")
        self.upstream_paused = True

    def resume_upstream(self) -> None:
        self._record("resume_upstream")
        self.upstream_paused = False

    def close(self, abort: bool) -> None:
        self._record("close", abort)
        assert self.closed is None, "closed twice"
        self.closed = abort

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        self._record("call_later", delay)
        return self.timers.call_later(delay, callback)

    def defer(self, callback: Callable[[], None]) -> None:
        self._record("defer")
        if self.put_off:
            self.deferred.append(callback)
        else:
            callback()

    def turn(self) -> None:
        """The event loop's next turn: the callbacks put off until then, in order (and any they put off)."""
        while self.deferred:
            self.deferred.pop(0)()

    def read_upstream_into(self, on: bool) -> None:
        self._record("read_upstream_into", on)
        assert on != self.reading_into, f"read_upstream_into({on}) twice"
        self.reading_into = on

    def deliver(self, conn: Connection, data: bytes) -> None:
        """``data`` from the upstream, as one read hands it over (``upstream_data``) or, while the core asked for
        it, as reads into its buffer, each as large as the buffer or what is left of ``data``."""
        pos = 0
        while pos < len(data):
            if self.reading_into:
                target = conn.upstream_buffer()
                n = min(len(target), len(data) - pos)
                target[:n] = data[pos : pos + n]
                pos += n
                conn.upstream_read_into(n)
            else:
                conn.upstream_data(data[pos:])
                return

    def gone(self) -> None:
        """The client went away (the test then calls ``Connection.client_lost``)."""
        self.lost = True

    # --------------------------------------------------------------------------------- reading it back

    def named(self, *names: str) -> list[tuple[str, Any]]:
        """The actions with these names, in order."""
        return [a for a in self.actions if a[0] in names]

    def take_client(self) -> bytes:
        """The bytes the client received since the last call."""
        out, self.client = bytes(self.client), bytearray()
        return out

    def take_upstream(self) -> bytes:
        """The bytes the upstream received since the last call."""
        out, self.upstream = bytes(self.upstream), bytearray()
        return out


class CoreRig:
    """What one proxy's connections share (the chain built from settings, response memory, topic names,
    metrics, an access log in memory, the fake clock and its timers), and connections made on it."""

    def __init__(self, overrides: dict[str, Any] | None = None, *, limits: Limits | None = None,
                 now: float = 100.0, put_off: bool = False) -> None:
        self.clock = Clock(now)
        self.timers = Timers(self.clock)
        self.log = io.StringIO()
        self.access_log = AccessLog(self.log, clock=self.clock)
        self.proxy = SansIOProxy(overrides, clock=self.clock, access_log=self.access_log)
        self.metrics = self.proxy.metrics
        self.names = self.proxy.names
        self.memory = HeldBytes(self.proxy.settings.size_limit.global_max_bytes,
                                on_change=self.metrics.response_bytes_held.set)
        self.limits = limits if limits is not None else Limits()
        self.put_off = put_off  # each port's FakePort.put_off: its deferred callbacks wait for turn()
        self.ports: list[FakePort] = []
        self._ids = 0

    def connect(self, *, ready: bool = True, host: str = "",
                principal: str | None = None) -> tuple[Connection, FakePort]:
        """A new client connection (and its upstream connection, up unless ``ready`` is False), from ``host`` and
        authenticated as ``principal`` when given."""
        self._ids += 1
        port = FakePort(self.timers, put_off=self.put_off)
        events = ConnectionEvents(self.metrics, self.access_log, self.proxy.chain)
        info = ConnectionInfo(self._ids, "bootstrap", client_host=host, principal=principal)
        conn = Connection(info, self.proxy.chain, port, memory=self.memory,
                          names=self.names, observer=events, tallies=events.tallies, clock=self.clock,
                          limits=self.limits)
        if ready:
            conn.upstream_ready("broker:9092")
        self.ports.append(port)
        return conn, port

    def turn(self) -> None:
        """The event loop's next turn: every port's put-off callbacks, in the order of the ports."""
        for port in self.ports:
            port.turn()

    def advance(self, seconds: float) -> None:
        self.turn()  # an event loop runs what is ready before it waits for a timer
        self.timers.advance(seconds)

    def lines(self) -> list[dict[str, Any]]:
        """The access-log lines written so far, parsed."""
        return [json.loads(line) for line in self.log.getvalue().splitlines()]

    def rejected(self, reason: str) -> float:
        return self.metrics.total("sluice_frames_rejected_total", reason=reason)


# ----------------------------------------------------------------------------------------------- frames


def request(api_key: int, version: int, corr: int, body: Message | None = None, client_id: str = "c") -> bytes:
    """A request frame (no size prefix); the API's default body unless ``body``."""
    header = Message(request_api_key=api_key, request_api_version=version, correlation_id=corr, client_id=client_id)
    return encode_request(header, body if body is not None else request_codec(api_key, version).default())


def response(api_key: int, version: int, corr: int, body: Message | None = None) -> bytes:
    """A response frame (no size prefix); the API's default body unless ``body``."""
    return encode_response(api_key, version, Message(correlation_id=corr),
                           body if body is not None else response_codec(api_key, version).default())


def sized(*frames: bytes) -> bytes:
    """Frames as on the wire: each with its 4-byte size prefix."""
    return b"".join(len(f).to_bytes(4, "big") + f for f in frames)
