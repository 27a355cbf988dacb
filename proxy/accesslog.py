"""Logging: the operational log (structlog, stderr) and the per-request access log (structlog, JSON lines).

``configure_logging(settings.logging)`` sets both up once at start-up and returns the :class:`AccessLog` (also
available later as :func:`get_access_log`). ``get_logger("sluice.<part>")`` gives an operational logger.

Access log schema, version 1
----------------------------

One JSON object per line, one line per request/response pair, written when the response has been handed to the
client (so ``ts`` minus ``latency_ms`` is roughly when the request arrived). Field order is fixed. It is the
input of the Spark pipeline, so the schema is versioned: adding a field keeps ``schema`` at 1 (readers must
ignore unknown fields); renaming or removing a field, or changing its type or meaning, increments it.

The fields every line carries, in order, are :data:`CORE_FIELDS` (name, JSON type, meaning; the documentation's
access-log reference, ``proxy/reference.py``, is generated from it).

After those come the optional fields the policies declare (each policy's ``Registration.log_fields``: name, type
and meaning; the reference lists every one with its policy), each only on the lines its policy sets it on
(``Exchange.log``), in the order they were set. A value is written as JSON: an int or a string as such, anything
else through :func:`json.dumps`.

Cost: ``record()`` formats the line itself, from its arguments, in one %-format: the timestamp's seconds are
formatted once per second, and the fields that repeat on a connection's requests (its id, client id, API, listener,
upstream, address, principal) are formatted and JSON-escaped once per combination and cached. That is ~25k machine
instructions per line (``python -m bench.instructions --case produce --policies all``, against ``--access-log
off``), ~40% less than one f-string formatting every value (~3 us per call on this project's machines then);
routing the same event through a structlog BoundLogger, even with one hand-written
renderer as its only processor, measured ~7.5 us (kwargs copies, context dict, processor call), and
structlog's stock TimeStamper + JSONRenderer ~9-10 us - too much for something paid on every request. So
structlog drives the operational log, and the access log keeps structlog's output conventions (one JSON object
per line, an ``event`` key) without its per-call machinery. With ``access_log = "off"`` record() returns at
once (~0.3 us); callers that must gather fields expensively can test ``access_log.enabled`` first. Writes are
buffered and flushed at most once a second: by ``record()`` itself, by a timer on the running event loop for lines
that would otherwise wait for the next request (the last ones of a burst), and by ``flush()``/``close()`` (call at
shutdown). The proxy is single-threaded (one event loop), so nothing here takes a lock.

A sink (:meth:`AccessLog.attach_sink`; the Kafka one is proxy/accesslog_kafka.py, ``[logging.access_log_kafka]``)
gets the same formatted line, also when the destination is ``off``: ``record()`` then calls one bound function that
writes the file and offers the line (measured: +0.6-0.8 us per record for the Kafka sink,
``python -m bench.accesslog_sink``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from math import isfinite as _isfinite
from typing import Any, NamedTuple, Protocol, TextIO

import structlog

from proxy.config import LoggingSettings

__all__ = ["CORE_FIELDS", "SCHEMA_VERSION", "AccessLog", "KeptListing", "LineSink", "Listing", "LogLimiter",
           "SluiceHandler", "configure_logging", "get_access_log", "get_logger", "reset_access_log"]

SCHEMA_VERSION = 1

#: the fields of every access-log line (optional ones where they apply), in order: name, JSON type, meaning
CORE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ('schema', 'int', 'schema version, ``1``'),
    ('event', 'string', 'always ``"request"``'),
    ('ts', 'string', 'ISO-8601 UTC with microseconds, ``2025-01-31T12:34:56.789012Z``'),
    ('conn_id', 'int', 'client connection id, unique within one proxy process'),
    ('client_id', 'string|null', 'Kafka request header client_id (null when the client sent none)'),
    ('api', 'string', 'Kafka API name, e.g. ``"Fetch"``'),
    ('api_key', 'int', 'Kafka API key, e.g. ``1``'),
    ('version', 'int', 'request API version'),
    ('correlation_id', 'int', 'request header correlation id'),
    ('listener', 'string', 'the listener the client connected to: ``bootstrap`` or ``broker-N``'),
    ('upstream', 'string', 'upstream broker that served it, ``host:port``'),
    ('bytes_client_to_proxy', 'int', 'request bytes read from the client (frame incl. 4-byte length)'),
    ('bytes_proxy_to_upstream', 'int', 'request bytes sent upstream (0 if the proxy answered itself)'),
    ('bytes_upstream_to_proxy', 'int', 'response bytes read from upstream (0 if the proxy answered itself)'),
    ('bytes_proxy_to_client', 'int', 'response bytes written to the client'),
    ('latency_ms', 'float|null', 'request read -> response written, milliseconds, 3 decimals (us); null if not a '
                                 'finite number'),
    ('error_codes', 'int[]', 'non-zero Kafka error codes seen in the response (empty: none, or the response was '
                             'relayed without decoding)'),
    ('decoded', 'bool', 'the proxy decoded the request/response (false = relayed as bytes)'),
    ('partitions', 'object[]', 'optional, only for Fetch responses Sluice decoded (a policy applied): ``{"topic", '
                               '"partition", "bytes"}`` per partition, record bytes sent to the client; the topic is '
                               'its name (Sluice looks up the names of Fetch v13+ topic ids first), or its topic id '
                               "(Kafka's base64 form) when that lookup found no such topic or failed"),
    ('client_address', 'string', "optional, the client's IP address (the PROXY protocol header's source on listeners "
                                 "that read one, else the peer's); absent when unknown (e.g. a Unix socket)"),
    ('principal', 'string', 'optional, only on connections whose SASL authentication the broker accepted: the '
                            "principal's name (PLAIN user, SCRAM ``n=``, the OAUTHBEARER token's ``sub``), never a "
                            'credential'),
)

#: an access-log line from ``ts``'s microseconds on: the per-second prefix (up to ``ts``'s seconds), microseconds,
#: the per-connection parts around ``correlation_id``, the numbers, the optional fields
_LINE = ('%s%06dZ",%s%d%s%d,"bytes_proxy_to_upstream":%d,"bytes_upstream_to_proxy":%d,"bytes_proxy_to_client":%d,'
         '"latency_ms":%.3f,"error_codes":[%s],"decoded":%s%s}\n')
#: the same with a non-finite latency (``"null"``)
_LINE_NULL = _LINE.replace("%.3f", "%s")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

#: the bound of the access log's caches (strings escaped, per-connection parts): cleared when full, since what they
#: key on (client ids) is the clients' choice
_CACHE_MAX = 4096


class _JsonStrings:
    """JSON-escaped strings, cached: client ids, API names and addresses repeat on every request.

    Bounded because client_id is chosen by clients; a client inventing a new id per request only costs a
    periodic clear, not memory.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._cache)

    def __call__(self, value: str | None) -> str:
        if value is None:
            return "null"
        cached = self._cache.get(value)
        if cached is None:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            cached = self._cache[value] = json.dumps(value)
        return cached


#: the most ``partitions`` items kept formatted (~230 bytes each: ~4.5 MB at most); a consumer of 10,000 partitions
#: finds all of its own
_ITEMS_MAX = 20_000


class _PartitionItems(dict[tuple[str, int, int], str]):
    """The JSON text of a ``partitions`` item, looked up by its (topic, partition, bytes). A consumer's fetches
    list the same partitions, most with no bytes, line after line: an item without bytes is formatted once and
    kept (10,000 of them: ~5 ms of f-strings a line, ~1 ms of look-ups), one with bytes each time (+0.15 us
    against the f-string alone). Bounded: when full it is cleared."""

    __slots__ = ("_js",)

    def __init__(self, js: Callable[[str | None], str]) -> None:
        super().__init__()
        self._js = js

    def __missing__(self, row: tuple[str, int, int]) -> str:
        topic, partition, size = row
        item = _item(self._js(topic), partition, size)
        if not size:
            if len(self) >= _ITEMS_MAX:
                self.clear()
            self[row] = item
        return item


def _item(topic_json: str, partition: int, size: int) -> str:
    """A ``partitions`` item's JSON text (its topic already JSON)."""
    return f'{{"topic":{topic_json},"partition":{partition},"bytes":{size}}}'


class KeptListing(NamedTuple):
    """The ``partitions`` of a Fetch response assembled from encodings kept across responses (terminate mode's full
    response to a session-less client, proxy/policies/terminate/policy.py's FullResponse): its partitions' keys,
    the same list object fetch after fetch while the client asks for the same partitions, the few that carry
    bytes, and each topic key's name. The access log keeps the text of a key list and rewrites only the items
    with bytes (:class:`_KeptTexts`): a line costs O(partitions with bytes) and one join, not a row and a look-up
    per partition (10,000 partitions: ~4 ms a line, and the rows' garbage collections)."""

    #: (topic key, partition) in the response's order; not changed while it is listed
    keys: Sequence[tuple[Any, int]]
    #: each topic key's name in the log (a topic id's label when its name is unknown)
    labels: Mapping[Any, str]
    #: record bytes of the partitions that carry any (the rest have none)
    sizes: Mapping[Any, int]

    def rows(self) -> list[tuple[str, int, int]]:
        """The listing as (topic, partition, bytes) rows."""
        labels, sizes = self.labels, self.sizes
        return [(labels[topic], index, sizes.get((topic, index), 0)) for topic, index in self.keys]


#: what an access-log line's ``partitions`` is made from: (topic, partition, bytes) rows, or a kept listing
Listing = list[tuple[str, int, int]] | KeptListing


#: what _KeptTexts keeps of a key list: the list, the labels its texts were made with, each item's text without
#: bytes, each key's place
_Kept = tuple[Sequence[Any], dict[Any, str], list[str], dict[Any, int]]


class _KeptTexts:
    """The ``partitions`` text of kept listings (:class:`KeptListing`), per key list (by identity, held while
    kept): each item's text without bytes, made once, and each key's place; a line copies the texts, rewrites the
    items with bytes and joins them. A new list, or new labels (a topic id's name learnt), makes them again.
    Bounded as :class:`_PartitionItems`: at most ``_ITEMS_MAX`` keys kept, the oldest list dropped first; a list
    longer than that, or naming a partition twice, is listed item by item."""

    __slots__ = ("_count", "_js", "_kept")

    def __init__(self, js: Callable[[str | None], str]) -> None:
        self._js = js
        #: id(keys) -> what is kept of it
        self._kept: dict[int, _Kept] = {}
        self._count = 0

    def text(self, listing: KeptListing, items: _PartitionItems) -> str:
        kept = self._kept.get(id(listing.keys))
        if kept is None or kept[0] is not listing.keys or kept[1] != listing.labels:
            kept = self._keep(listing)
            if kept is None:
                return ",".join(map(items.__getitem__, listing.rows()))
        _, labels, texts, place = kept
        if listing.sizes:
            js = self._js
            texts = texts.copy()
            for key, size in listing.sizes.items():
                i = place.get(key)
                if i is None:  # bytes for a partition the response does not list: not a kept listing's
                    return ",".join(map(items.__getitem__, listing.rows()))
                texts[i] = _item(js(labels[key[0]]), key[1], size)
        return ",".join(texts)

    def _keep(self, listing: KeptListing) -> _Kept | None:
        keys = listing.keys
        old = self._kept.pop(id(keys), None)
        if old is not None:
            self._count -= len(old[0])
        if len(keys) > _ITEMS_MAX:
            return None
        place = dict(zip(keys, range(len(keys)), strict=True))
        if len(place) != len(keys):
            return None
        while self._kept and self._count + len(keys) > _ITEMS_MAX:
            self._count -= len(self._kept.pop(next(iter(self._kept)))[0])
        labels = dict(listing.labels)
        quoted = {topic: self._js(label) for topic, label in labels.items()}
        texts = [_item(quoted[topic], index, 0) for topic, index in keys]
        kept = self._kept[id(keys)] = (keys, labels, texts, place)
        self._count += len(keys)
        return kept


class _LineWriter:
    """Writes access-log lines; flushes at most once an interval so a quiet proxy's lines still surface.

    Lines written within an interval of the last flush are flushed when it ends, whether or not another line
    comes: on the running event loop (the proxy's) by a timer; without one (scripts, tests), by the next line or
    ``close()``."""

    def __init__(self, out: TextIO, flush_interval_s: float) -> None:
        self.out = out
        self._interval = flush_interval_s
        self._next_flush = 0.0
        self._flush_timer: asyncio.TimerHandle | None = None
        self.dropped = 0
        #: called once per line lost (the proxy's sluice_access_log_dropped_total), see AccessLog.count_drops
        self.on_drop: Callable[[], object] | None = None

    def write(self, line: str) -> None:
        try:
            self.out.write(line)
            now = time.monotonic()
            if now >= self._next_flush:
                self._next_flush = now + self._interval
                self.out.flush()
            elif self._flush_timer is None:
                self._flush_later(self._next_flush - now)
        except (OSError, ValueError) as exc:  # disk full, closed pipe/file: never break the request path
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop()
            if self.dropped == 1:
                get_logger("sluice.accesslog").error("access_log_write_failed", error=str(exc))

    def _flush_later(self, delay: float) -> None:
        # asyncio's own no-raise lookup: get_running_loop() raising for every line written without a loop
        # (scripts, benches) costs more than the line
        loop = asyncio._get_running_loop()
        if loop is None:
            return  # no loop: the next line or close() flushes
        self._flush_timer = loop.call_later(delay, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_timer = None
        self._next_flush = time.monotonic() + self._interval
        with contextlib.suppress(OSError, ValueError):  # as AccessLog.flush: a closed or failing destination
            self.out.flush()


class LineSink(Protocol):
    """Somewhere else every access-log line goes (proxy/accesslog_kafka.py): ``offer`` takes the formatted line,
    newline included, and must return at once, never raise and never block."""

    def offer(self, line: str) -> None: ...


class AccessLog:
    """The per-request access log.

    ``destination``: ``"-"`` stdout, ``"off"``, a file path (appended), an open text stream (tests), or the
    ``LoggingSettings`` (its ``access_log``). A file is opened here: a bad path fails at start-up (OSError).
    Prefer :func:`get_access_log` in the server: ``configure_logging`` already made one, and two objects on
    one file would each keep their own buffer.
    """

    def __init__(
        self,
        destination: str | TextIO | LoggingSettings = "off",
        *,
        flush_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path: str | None = None
        out: TextIO | None
        if isinstance(destination, LoggingSettings):
            destination = destination.access_log
        if isinstance(destination, str):
            if destination == "off":
                out = None
            elif destination == "-":
                out = sys.stdout
            else:
                self._path = destination
                out = self._open(destination)
        else:
            out = destination
        #: whether the destination (file, stdout, stream) is written; ``enabled``: whether record() does anything
        self._file_enabled = out is not None
        self._sink: LineSink | None = None
        self._writer = _LineWriter(out if out is not None else io.StringIO(), flush_interval_s)
        self._write: Callable[[str], None] = self._writer.write
        self.enabled = self._file_enabled
        self._clock = clock
        self._sec = -1  # the second self._prefix was formatted for
        self._prefix = ""
        #: the JSON-escaped strings of client ids, API names and addresses, cached (bounded)
        self.strings = _JsonStrings()
        self._items = _PartitionItems(self.strings)
        self._kept = _KeptTexts(self.strings)
        #: per (conn_id, client_id, api, api_key, version, listener, upstream, client_address, principal): the
        #: line's text around correlation_id and the optional client_address/principal fields (bounded)
        self._parts: dict[tuple[Any, ...], tuple[str, str, str]] = {}

    @staticmethod
    def _open(path: str) -> TextIO:
        # Append, never truncate: several runs (and the Spark job) read one growing file.
        return open(path, "a", encoding="utf-8", buffering=1 << 16)  # owned: closed in close()

    @property
    def dropped(self) -> int:
        """Lines lost to write errors."""
        return self._writer.dropped

    def count_drops(self, on_drop: Callable[[], object]) -> None:
        """Call ``on_drop()`` for every line lost from now on (the proxy passes its
        ``sluice_access_log_dropped_total`` counter's ``inc``)."""
        self._writer.on_drop = on_drop

    @property
    def sink(self) -> LineSink | None:
        return self._sink

    def attach_sink(self, sink: LineSink) -> None:
        """Send every line to ``sink`` as well (also when the destination is ``off``): the same line, formatted
        once."""
        self._sink = sink
        self._rewire()

    def detach_sink(self) -> None:
        self._sink = None
        self._rewire()

    def _rewire(self) -> None:
        """Point ``_write`` at what is on (one bound call per record: no test per record)."""
        sink = self._sink
        if sink is None:
            self._write = self._writer.write
        elif not self._file_enabled:
            self._write = sink.offer
        else:
            write, offer = self._writer.write, sink.offer

            def both(line: str) -> None:
                write(line)
                offer(line)

            self._write = both
        self.enabled = self._file_enabled or sink is not None

    def record(
        self,
        conn_id: int,
        client_id: str | None,
        api: str,
        api_key: int,
        version: int,
        correlation_id: int,
        bytes_client_to_proxy: int,
        bytes_proxy_to_upstream: int,
        bytes_upstream_to_proxy: int,
        bytes_proxy_to_client: int,
        latency_ms: float,
        error_codes: Sequence[int],
        listener: str,
        upstream: str,
        decoded: bool,
        partitions: Listing | None = None,
        client_address: str | None = None,
        principal: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Write one access-log line (see the module docstring for the schema). Never raises on I/O errors.

        The arguments may be passed by position, in this order: the connection observer does, once per request
        (matching 19 keywords costs more than formatting the line's numbers)."""
        if not self.enabled:
            return
        # Rounded to the nearest microsecond, as datetime.fromtimestamp does (truncating would turn
        # 1.000001, stored as 1.00000095..., into 1.000000).
        t_us = int(self._clock() * 1e6 + 0.5)
        sec = t_us // 1_000_000
        if sec != self._sec:  # strftime once per second; microseconds are appended per call
            self._sec = sec
            self._prefix = f'{{"schema":{SCHEMA_VERSION},"event":"request","ts":"' \
                           f'{time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))}.'
        # What repeats on every request of a connection (its id, client id, API, listener, upstream, address,
        # principal), formatted and escaped once per combination.
        key = (conn_id, client_id, api, api_key, version, listener, upstream, client_address, principal)
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts_of(key)
        head, tail, end = parts
        if partitions is not None:
            end = _partitions_json(partitions, self._items, self._kept) + end
        # The fields policies set on this line (Exchange.log), in the order set; inline: a call per line measured
        # ~0.6k instructions.
        if fields:
            for name, value in fields.items():
                if type(value) is int:
                    end += f',"{name}":{value}'
                elif type(value) is str:
                    end += f',"{name}":{self.strings(value)}'
                else:
                    end += f',"{name}":{json.dumps(value, separators=(",", ":"))}'
        # One %-format for the rest: measured cheaper than an f-string's per-value formatting.
        fmt, latency = (_LINE, latency_ms) if _isfinite(latency_ms) else (_LINE_NULL, "null")
        self._write(fmt % (self._prefix, t_us - sec * 1_000_000, head, correlation_id, tail, bytes_client_to_proxy,
                           bytes_proxy_to_upstream, bytes_upstream_to_proxy, bytes_proxy_to_client, latency,
                           ",".join(map(str, error_codes)) if error_codes else "", "true" if decoded else "false",
                           end))

    def _parts_of(self, key: tuple[Any, ...]) -> tuple[str, str, str]:
        """The formatted fields of a line that repeat per connection (see :meth:`record`), cached (bounded as
        :class:`_JsonStrings`: client ids are the client's choice)."""
        conn_id, client_id, api, api_key, version, listener, upstream, client_address, principal = key
        js = self.strings
        parts = (f'"conn_id":{conn_id},"client_id":{js(client_id)},"api":{js(api)},"api_key":{api_key},'
                 f'"version":{version},"correlation_id":',
                 f',"listener":{js(listener)},"upstream":{js(upstream)},"bytes_client_to_proxy":',
                 _who_json(client_address, principal, js))
        if len(self._parts) >= _CACHE_MAX:
            self._parts.clear()
        self._parts[key] = parts
        return parts

    def flush(self) -> None:
        if self._file_enabled:
            try:
                self._writer.out.flush()
            except (OSError, ValueError):
                pass

    def reopen(self) -> None:
        """Close and reopen a file destination (after external log rotation, e.g. on SIGHUP)."""
        if self._path is not None:
            self.close()
            self._writer.out = self._open(self._path)
            self._file_enabled = True
            self._rewire()

    def close(self) -> None:
        """Flush; close the file if this object opened it (never stdout or a stream it was given)."""
        self.flush()
        if self._path is not None and self._file_enabled:
            self._writer.out.close()
            self._file_enabled = False
            self._rewire()


def _who_json(client_address: str | None, principal: str | None, js: Callable[[str | None], str]) -> str:
    """The optional ``client_address`` and ``principal`` fields (only when known)."""
    out = ""
    if client_address is not None:
        out += f',"client_address":{js(client_address)}'
    if principal is not None:
        out += f',"principal":{js(principal)}'
    return out


def _partitions_json(partitions: Listing, items: _PartitionItems, kept: _KeptTexts) -> str:
    """The optional ``partitions`` field: record bytes sent to the client per partition of a decoded Fetch."""
    if isinstance(partitions, KeptListing):
        return f',"partitions":[{kept.text(partitions, items)}]'
    return f',"partitions":[{",".join(map(items.__getitem__, partitions))}]'


_access_log = AccessLog("off")
_atexit_registered = False


def get_access_log() -> AccessLog:
    """The access log set up by the last :func:`configure_logging` (a disabled one before that)."""
    return _access_log


def reset_access_log() -> None:
    """Close the access log :func:`configure_logging` set up, and go back to none (what a test undoes)."""
    global _access_log
    _access_log.close()
    _access_log = AccessLog("off")


class LogLimiter:
    """At most one log event per key per ``interval_s``: what to log while something fails in a loop (a broker
    that is down, retried by every client connection) without flooding the log. Sans-IO: the clock is
    injected."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[Any, float] = {}
        self._suppressed: dict[Any, int] = {}

    def allow(self, key: Any) -> int | None:
        """None: do not log this one (it is counted). Otherwise log it, with the returned count of events
        for ``key`` not logged since the last one."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._suppressed.pop(key, 0)


def get_logger(name: str) -> Any:
    """An operational logger (structlog bound logger) that adds ``logger=name`` to its events.

    Lazy: it picks up :func:`configure_logging` even when created at import time, before configuration.
    (Not ``structlog.get_logger().bind(logger=name)``: bind() builds the real logger at once, with whatever
    configuration exists at import time. Nor ``get_logger(logger=name)``: ``logger`` collides with
    wrap_logger's own parameter. The name travels as the logger-factory argument instead.)
    """
    return structlog.get_logger(name)


class _NamedWriteLogger(structlog.WriteLogger):
    """structlog's WriteLogger plus the name given to :func:`get_logger`."""

    def __init__(self, file: TextIO, name: str | None) -> None:
        super().__init__(file)
        self.name = name


def _add_logger_name(logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    name = getattr(logger, "name", None)
    if name is not None:
        event.setdefault("logger", name)
    return event


class SluiceHandler(logging.StreamHandler[TextIO]):
    """Marks the root handler we install, so reconfiguring replaces ours and leaves others' (pytest) alone."""


def configure_logging(settings: LoggingSettings) -> AccessLog:
    """Set up the operational log (stderr, ``settings.level``, ``settings.format``) and the access log
    (``settings.access_log``); returns the access log. Raises OSError if the access-log file cannot be opened.
    Safe to call again (tests, reload): the previous access log is flushed and closed."""
    global _access_log, _atexit_registered
    level = _LEVELS[settings.level]
    stderr = sys.stderr  # the stream at configuration time (pytest's capture swaps sys.stderr)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
    ]
    renderer: Any
    if settings.format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        exc: list[Any] = []  # ConsoleRenderer formats exceptions itself
    else:
        renderer = structlog.processors.JSONRenderer()
        exc = [structlog.processors.format_exc_info]
    structlog.configure(
        processors=[_add_logger_name, *shared, structlog.processors.StackInfoRenderer(), *exc, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *args: _NamedWriteLogger(stderr, args[0] if args else None),
        # Not cached: module-level get_logger() proxies must see a later reconfiguration (tests); operational
        # logs are not per request, so the extra bind per call does not matter.
        cache_logger_on_first_use=False,
    )

    # Libraries (asyncio, kafka-python) log through the standard library: render them the same way, to stderr.
    handler = SluiceHandler(stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, *exc],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, SluiceHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)

    new = AccessLog(settings.access_log)
    _access_log.close()
    _access_log = new
    if not _atexit_registered:
        # Buffered lines must reach the file even if the server forgets close(); stdout flushes itself.
        atexit.register(lambda: _access_log.flush())
        _atexit_registered = True
    return new
