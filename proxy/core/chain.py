"""The policy chain: runs a proxy's policies over every request and response, decoding only what they need.
Sans-IO: bytes and exchanges in, exchanges with their effects out.

- :meth:`Chain.classify` reads a request frame's header (one struct unpack), refuses what Kafka does not define,
  and, when every policy declaring its API leaves that version alone under the settings in force
  (:meth:`~proxy.core.policy.Policy.unread`, asked per API version when the chain is built and reconfigured),
  returns it as a :class:`~proxy.core.exchange.Relayed`: sent as it came, its response relayed as bytes, no
  policy called but those whose terms count each request as it arrives
  (:attr:`~proxy.core.exchange.Relay.arrival`: one call with its header and size, relayed or not; only one that
  hands on a state makes it an Exchange). Otherwise it picks the policies that apply (by API, then
  :meth:`~proxy.core.policy.Policy.applies`): when none of those with an ``applies`` of their own applies and
  the others leave that version alone, the request is a :class:`~proxy.core.exchange.Relayed` too (e.g. a
  consumer's fetch cooperative consumption does not filter); else, if one of them reads topic names (or decodes
  a Fetch response the access log lists by topic), lists the topic ids Sluice must learn before they run (the
  connection core waits for them).
- :meth:`Chain.on_request` runs those policies in registration order (client side first). The request is decoded
  on first access by any of them and re-encoded once at the end, only if one changed it. A policy that answers
  (``ex.answer``) ends the walk: the request never goes upstream. A policy that asks for work of Sluice's own
  first (``ex.pending``) pauses it: the connection core waits, then calls :meth:`Chain.on_request` again, which
  resumes that policy (:meth:`~proxy.core.policy.Policy.on_resume`) and goes on with the next ones.
- :meth:`Chain.on_response` decodes the response once into the API's view (:mod:`proxy.wire.views`), runs the
  policies that asked to see it in the reverse order (back towards the client), and encodes it once, only if
  one changed it. A policy asking for the request to go upstream again (``ex.resend``) ends the walk: the
  policies after it (nearer the broker) run their request side again on the frame it put in ``ex.frame``
  (:meth:`Chain.on_response`), and the next response goes through them again before it reaches that policy.

A policy's hook that raises becomes :class:`PolicyFailed`, naming the policy and the hook (but a rejection; and on
the response side a CodecError, the broker's bytes found malformed as a policy reads them): the connection core
closes that connection only and :meth:`Chain.report` logs and counts it, so a policy's bug never reaches the event
loop's fatal-error path and never concerns other connections.

Which policies exist, in which order, is decided in one place: ``proxy/policies/__init__.py``.
"""

from __future__ import annotations

import struct
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any, Literal, cast, overload

from ..accesslog import AccessLog, KeptListing, Listing, get_logger
from ..metrics import Metrics
from ..wire.api_keys import ApiKey, api_names
from ..wire.errors import CodecError, MalformedFrame
from ..wire.fetch_fast import FetchResponseView
from ..wire.fetch_layout import FIRST_TOPIC_ID, TopicKey
from ..wire.fetch_request_fast import FetchEdit, topic_keys
from ..wire.fetch_stream import FetchStreamer
from ..wire.messages import RequestHeader, peek_request_header, request_header_version
from ..wire.produce import produce_acks
from ..wire.views import FetchResponse, response_view
from .exchange import (
    NO_FIELDS,
    ArrivalTerms,
    Buffer,
    ConnectionInfo,
    Exchange,
    PolicyFailed,
    Rejected,
    Relayed,
    Streamer,
)
from .policy import Policy, Streamed, versions_read
from .topic_names import TopicNames

_log = get_logger("sluice.chain")
_PRODUCE, _FETCH = ApiKey.PRODUCE, ApiKey.FETCH  # module constants: compared on every request

#: a route (:meth:`Chain.classify`): the one policy's terms (Relay: the response's check, its streamer, its
#: rewrite) and that policy, which reads the response when the check is false (or the rewrite gives None)
Route = tuple[Callable[[Buffer], bool] | None, Callable[[int], Streamer] | None,
              Callable[[Buffer], bytes | None] | None, tuple[Policy, ...]]
#: the route of an API no policy declares
_UNREAD: Route = (None, None, None, ())
#: an API version relayed unread (:meth:`Chain.relay`): its key and version, name, route, whether its request header
#: is v2 (a tag section after the client id, KIP-482), whether it is a Produce (its Acks read)
Unread = tuple[int, int, str, Route, bool, bool]
#: a whole request's size prefix skipped: api key and version (as api_key << 16 | version: both are >= 0),
#: correlation id, client id length
_KEY_CORR_LENGTH = struct.Struct(">iih")
#: the fields of an access-log partition row: (topic, partition, record bytes)
_TOPIC, _PARTITION, _SIZE = itemgetter(0), itemgetter(1), itemgetter(2)
#: a RequestHeader from its fields' tuple in one C call (as wire/messages.py makes them)
_header = tuple.__new__


class ChainConnection:
    """The policies' states for one client connection."""

    __slots__ = ("info", "states")

    def __init__(self, info: ConnectionInfo, states: dict[Policy, Any]) -> None:
        self.info = info
        self.states = states


class Chain:
    def __init__(self, policies: Sequence[Policy], metrics: Metrics, names: TopicNames,
                 access_log: AccessLog | None = None) -> None:
        self.policies = tuple(policies)
        self.metrics = metrics
        self.names = names
        #: per-partition access-log fields are gathered only when the access log is written
        self.access_log = access_log
        by_api: dict[int, list[Policy]] = {}
        for policy in self.policies:
            for api in policy.apis:
                by_api.setdefault(api, []).append(policy)
        self._by_api = {api: tuple(ps) for api, ps in by_api.items()}
        #: api key -> name, every API Kafka defines (the one table, wire/api_keys.py): one look-up per request
        self._api_names = api_names()
        #: per API a policy declares, the versions all of them read: ApiVersions offers clients no others
        self._versions = {api: range(v.low, v.high + 1) for api, v in versions_read(self.policies).items()}
        self._on_sent = frozenset(p for p in self.policies if type(p).on_sent is not Policy.on_sent)
        #: the policies that may read a Fetch response as it streams (:meth:`stream_fetch`)
        self._fetch_streamers = frozenset(p for p in self.policies if p not in self._on_sent
                                          and type(p).stream_fetch is not Policy.stream_fetch)
        #: the policies with an ``applies`` of their own: the others apply to every request of their APIs, uncalled
        self._selective = frozenset(p for p in self.policies if type(p).applies is not Policy.applies)
        #: the policies that may need topic names (to read them, or to have the access log show them)
        self._name_readers = frozenset(p for p in self.policies if p.decodes_fetch
                                       or type(p).needs_topic_names is not Policy.needs_topic_names)
        self._compose_routes()

    def _compose_routes(self) -> None:
        """The relay routes under the settings in force (when the chain is built and after each reconfiguration):
        of requests every policy leaves alone, and of those that none of the selective policies applies to."""
        self._routes = self._relay_routes()
        self._declined = self._relay_routes(self._selective)
        self._arrivals = self._arrival_terms()
        #: the API versions whose every request is relayed unread (no policy reads it, none counts it on arrival),
        #: learnt from each one's first request (:meth:`classify`), so only versions clients send and Sluice knows
        #: the header of (a bounded table): read by :meth:`relay`, or None where it cannot read them (classify's)
        self._unread: dict[int, Unread | None] = {}

    def _relay_routes(self, left: frozenset[Policy] = frozenset()) -> dict[int, Route]:
        """Per API version some policy declares (key ``api_key << 16 | version``), its route when every policy
        declaring it, but those ``left`` out, leaves it alone (:meth:`Policy.unread`); versions absent go through
        the policies. With the selective policies left out: the route of a request none of them applies to."""
        routes: dict[int, Route] = {}
        for key, candidates in self._by_api.items():
            for version in self._versions[key]:
                route = _UNREAD
                for policy in candidates:
                    if policy in left:
                        continue
                    unread = policy.unread(key, version)
                    if unread is False or (unread is not True and unread.reads_response and route[3]):
                        break  # it reads every request, or two policies read the response: the chain's path
                    if unread is not True and unread.reads_response:
                        route = (unread.check, unread.streamer, unread.rewrite, (policy,))
                else:
                    routes[key << 16 | version] = route
        return routes

    def _arrival_terms(self) -> dict[int, tuple[tuple[Policy, ArrivalTerms], ...]]:
        """Per API version some policy declares, the policies that count each of its requests as it arrives
        (:attr:`~proxy.core.exchange.Relay.arrival`), relayed or not, under the settings in force."""
        terms: dict[int, tuple[tuple[Policy, ArrivalTerms], ...]] = {}
        for key, candidates in self._by_api.items():
            for version in self._versions[key]:
                found = []
                for policy in candidates:
                    unread = policy.unread(key, version)
                    if unread is not True and unread is not False and unread.arrival is not None:
                        found.append((policy, unread.arrival))
                if found:
                    terms[key << 16 | version] = tuple(found)
        return terms

    # ------------------------------------------------------------------------------------ connections

    def connect(self, info: ConnectionInfo) -> ChainConnection:
        """The policies' states for a new connection; PolicyFailed if one's ``open`` raises (those opened
        already are closed again)."""
        states: dict[Policy, Any] = {}
        for policy in self.policies:
            try:
                states[policy] = policy.open(info)
            except Exception as e:
                self.disconnect(ChainConnection(info, states))
                raise PolicyFailed(policy.name, "open", None, e) from e
        return ChainConnection(info, states)

    def disconnect(self, conn: ChainConnection) -> None:
        """Each policy's ``close``; one that raises is reported and the others still close."""
        for policy, state in conn.states.items():
            try:
                policy.close(state)
            except Exception as e:
                self.report(PolicyFailed(policy.name, "close", None, e), conn.info)

    def report(self, failure: PolicyFailed, info: ConnectionInfo, client_id: str | None = None) -> None:
        """One ``policy_failed`` event and ``sluice_policy_errors_total{policy,api}`` (the traceback at DEBUG)."""
        api = failure.api or "none"
        self.metrics.policy_errors.labels(failure.policy, api).inc()
        error = failure.error
        _log.error("policy_failed", policy=failure.policy, hook=failure.hook, api=failure.api,
                   version=failure.version, conn=info.conn_id, listener=info.listener, client_id=client_id,
                   client=info.client_host or None, principal=info.principal, error_type=type(error).__name__,
                   error=str(error)[:500])
        _log.debug("policy_failed_traceback", policy=failure.policy, conn=info.conn_id,
                   traceback="".join(traceback.format_exception(error)))

    def reconfigure(self, sections: Mapping[Policy, Any]) -> None:
        """New run-time settings, each policy's own section: all or nothing. Every policy makes its change ready
        first (an error there changes nothing and propagates), then all are applied, none of which can fail."""
        ready = [policy.reconfigure(section) for policy, section in sections.items()]
        for apply in ready:
            apply()
        self._compose_routes()  # the next requests see the new settings' routes

    # --------------------------------------------------------------------------------------- requests

    @overload
    def classify(self, frame: bytes, now: float, info: ConnectionInfo | None = None,
                 relayable: Literal[False] = False) -> Exchange: ...

    @overload
    def classify(self, frame: bytes, now: float, info: ConnectionInfo | None, relayable: bool) -> Exchange | Relayed:
        ...

    def classify(self, frame: bytes, now: float, info: ConnectionInfo | None = None,
                 relayable: bool = False) -> Exchange | Relayed:
        """A request frame (no size prefix) as an exchange (of the connection ``info``), or, if ``relayable`` (the
        connection has nothing waiting ahead of it) and no policy reads its API version, as a
        :class:`Relayed`; Rejected if Sluice must not serve it."""
        try:
            header = peek_request_header(frame)
        except CodecError as e:
            raise Rejected("malformed", str(e)) from None
        key = header.api_key
        name = self._api_names.get(key)
        if name is None:
            # Relaying a key Kafka does not define would only hand the broker garbage; Kafka closes the
            # connection on one too (SocketServer: InvalidRequestException, "Unknown API key").
            raise Rejected("unknown_api", f"api key {key} is not a Kafka API")
        expects_response = True
        if key == _PRODUCE:
            try:
                expects_response = produce_acks(frame, header) != 0
            except CodecError as e:
                raise Rejected("malformed", str(e)) from None
        log: Mapping[str, Any] = NO_FIELDS
        arrived: dict[Policy, Any] | None = None
        if self._arrivals:
            terms = self._arrivals.get(key << 16 | header.api_version)
            if terms is not None:
                log, arrived = _arrive(terms, header, name, len(frame) + 4, info, expects_response)
        candidates = self._by_api.get(key)
        if relayable and arrived is None:
            route = _UNREAD if candidates is None else self._routes.get(key << 16 | header.api_version)
            if route is not None:
                version_key = key << 16 | header.api_version
                if header.body_offset is not None and version_key not in self._unread \
                        and not self._arrivals.get(version_key):
                    self._learn_unread(header, name, route)
                return Relayed(header, name, frame, now, expects_response, route[0], route[1], route[2], route[3],
                               log)
        ex = Exchange(header, name, len(frame) + 4, frame, now, expects_response, info=info, log=dict(log),
                      arrived=arrived)
        if candidates:
            if header.api_version not in self._versions[key]:
                # Sluice's ApiVersions never offered this version: a policy would be handed a layout it does not
                # read. Kafka closes the connection on a version it has not enabled (SocketServer
                # parseRequestHeader: InvalidRequestException), and so does Sluice, rather than relay it unread.
                raise Rejected("unsupported_version", f"{ex.api} v{header.api_version} is outside the versions "
                                                      f"Sluice's policies read ({_span(self._versions[key])})")
            applying = []
            selective = self._selective
            for policy in candidates:
                try:
                    if policy not in selective or policy.applies(ex):
                        applying.append(policy)
                except Exception as e:
                    _blame(policy, "applies", ex, e)
                    raise
            if relayable and arrived is None and selective.isdisjoint(applying):
                # none of the policies that choose their requests chose this one, and the others leave it alone
                route = self._declined.get(key << 16 | header.api_version)
                if route is not None:
                    return Relayed(header, name, frame, now, expects_response, route[0], route[1], route[2],
                                   route[3], log)
            ex.policies = tuple(applying)
            if key == _FETCH and header.api_version >= FIRST_TOPIC_ID \
                    and not self._name_readers.isdisjoint(applying) and self._names_wanted(ex, applying):
                # Fetch v13+ names topics by id only. They are read from the topic entries, not by decoding the
                # request (a terminate-mode client's later requests are read against its first: ~4.5 ms saved a
                # fetch of 10,000 partitions); decoded when that read cannot tell.
                keys = topic_keys(frame, header)
                if keys is None:
                    try:
                        request = ex.request
                    except MalformedFrame as e:
                        raise Rejected("malformed", str(e)) from None
                    assert isinstance(request, FetchEdit)
                    keys = request.view.topic_keys
                ex.missing_names = self.names.missing(keys)  # type: ignore[arg-type]
        return ex

    def _learn_unread(self, header: RequestHeader, name: str, route: Route) -> None:
        """Note, once per version, that every request of ``header``'s API version is relayed unread by ``route``:
        for :meth:`relay` when it can read what its requests need (a Produce's Acks in its flexible versions, v9+,
        only), else None (classify goes on reading them)."""
        key, version = header.api_key, header.api_version
        header_v2 = request_header_version(key, version) == 2  # the request is flexible (KIP-482)
        self._unread[key << 16 | version] = None if key == _PRODUCE and not header_v2 else \
            (key, version, name, route, header_v2, key == _PRODUCE)

    def relay(self, wire: bytes, now: float) -> Relayed | None:
        """A whole request as read (``wire``: size prefix included) as a :class:`Relayed` when its API version is
        relayed unread (:meth:`classify` learnt so from an earlier request) and its header has the usual shape;
        else None, and :meth:`classify` decides (and refuses what is malformed).

        The same reading as :func:`~proxy.wire.messages.peek_request_header` and
        :func:`~proxy.wire.produce.produce_acks` (a unit test holds them equal), spelt out in one function: this runs
        on every request a producer sends, on a processor whose caches its clients and the broker have just used,
        so each function, C call and line more is a cache miss more (docs/PERFORMANCE.md counts them)."""
        if len(wire) < 14:
            return None  # shorter than a request header: classify refuses it
        # api key and version read as one int32: the table's key (api_key << 16 | version), no arithmetic
        key_version, corr, n = _KEY_CORR_LENGTH.unpack_from(wire, 4)
        unread = self._unread.get(key_version)
        pos = 14 + n
        if unread is None or n < 0 or pos >= len(wire):
            return None  # null client id (-1) or a length beyond the frame: classify reads or refuses it
        key, version, name, route, header_v2, produce = unread
        try:
            client_id = wire[14:pos].decode()
        except UnicodeDecodeError:
            return None
        if header_v2:
            if wire[pos]:
                return None  # tagged fields in the header (KIP-482): classify skips them
            pos += 1
        expects = True
        if produce:
            # ProduceRequest v9+: TransactionalId (compact nullable string: length + 1 as an unsigned varint, 0 =
            # null), then Acks (int16); acks=0 is owed no response
            size = wire[pos] if pos < len(wire) else 0x80
            end = pos + (size or 1)
            if size >= 0x80 or end + 2 > len(wire):
                return None  # a transactional id of 127 bytes or more, or a truncated frame: classify's
            expects = wire[end] != 0 or wire[end + 1] != 0
        check, streamer, rewrite, readers = route
        return Relayed(_header(RequestHeader, (key, version, corr, client_id, pos - 4)), name, wire[4:], now,
                       expects, check, streamer, rewrite, readers, NO_FIELDS)

    def exchange(self, conn: ChainConnection, relayed: Relayed) -> Exchange:
        """A relayed request whose response its readers must see after all (its check was false, its rewrite gave
        None, or the response came split across reads) as an Exchange, with those readers'
        :meth:`Policy.on_request` run: by :meth:`Policy.unread`'s contract all they do is ask for the response.
        Rejected or PolicyFailed as for :meth:`on_request`."""
        ex = Exchange(relayed.header, relayed.api, relayed.size, relayed.frame, relayed.started,
                      relayed.expects_response, info=conn.info, policies=relayed.readers, attempts=1,
                      upstream_sent=relayed.upstream_sent, log=dict(relayed.log))
        self.on_request(conn, ex)
        return ex

    def _names_wanted(self, ex: Exchange, applying: list[Policy]) -> bool:
        """A policy reads topic names, or the access log will list this Fetch's partitions (a policy may decode
        its response): then a Fetch v13+ waits for the names of its ids (a connection that never sends Metadata
        would otherwise meet rules by topic name and be logged without them)."""
        log = self.access_log
        logged = log is not None and log.enabled
        for policy in applying:
            if policy not in self._name_readers:
                continue
            try:
                if policy.needs_topic_names(ex) or (logged and policy.decodes_fetch):
                    return True
            except Exception as e:
                _blame(policy, "needs_topic_names", ex, e)
                raise
        return False

    def on_request(self, conn: ChainConnection, ex: Exchange) -> None:
        """Run the policies on the request (after any topic-name lookup it waited for). Rejected if a policy
        finds it malformed or refuses it."""
        states = conn.states
        running: Policy | None = None  # the policy whose hook runs: a failure is its own
        hook = "on_request"
        try:
            done = len(ex.states)
            if ex.pending is not None:
                # resumed: the work the last policy that ran asked for is settled (the core waited for it)
                running = policy = ex.policies[done - 1]
                hook = "on_resume"
                ex.pending = None
                ex.states[done - 1] = policy.on_resume(ex, states[policy], ex.states[done - 1])
                if ex.answer is not None or ex.pending is not None:
                    return
                hook = "on_request"
            for policy in ex.policies[done:]:
                running = policy
                ex.states.append(policy.on_request(ex, states[policy]))
                if ex.answer is not None or ex.pending is not None:
                    return
            running = None
            if ex.relay_if is not None and len(ex.states) > 1 and sum(s is not None for s in ex.states) > 1:
                ex.relay_if = None  # another policy reads the response too: it is collected whatever it holds
            view = ex.view
            if view is not None and view.changed:
                ex.frame = view.encode()
        except MalformedFrame as e:  # the client's frame, whichever policy first read it
            raise Rejected("malformed", str(e)) from None
        except Exception as e:
            # a CodecError of a policy's own (its parsing of nested bytes, a value it cannot encode) is its failure
            _blame(running, hook, ex, e)
            raise

    # -------------------------------------------------------------------------------------- responses

    def on_response(self, conn: ChainConnection, ex: Exchange, frame: Buffer) -> None:
        """Run the interested policies on a collected response frame (no size prefix) in reverse order. Sets
        ``ex.reply`` (and the access-log fields), or ``ex.resend``. CodecError if the response is malformed."""
        h = ex.header
        response = response_view(h.api_key, h.api_version, frame)
        states = conn.states
        ran = ex.policies[: len(ex.states)]
        running: Policy | None = None  # the policy whose hook runs: a failure is its own
        hook = "on_response"
        try:
            for i in range(len(ran) - 1, -1, -1):
                state = ex.states[i]
                if state is None:
                    continue
                running = policy = ran[i]
                policy.on_response(ex, response, states[policy], state)
                if ex.resend:
                    running = None  # a failure from here is the policy's that fails (or the asking one's)
                    self._send_again(conn, ex, i)
                    return
            running = None
            ex.reply, ex.client_bytes = response.encode()
            ex.error_codes = response.error_codes()
            ex.decoded = True
            if self._on_sent:
                hook = "on_sent"
                for policy, state in zip(ran, ex.states, strict=True):
                    if state is not None and policy in self._on_sent:
                        running = policy
                        policy.on_sent(ex, states[policy], state)
        except Exception as e:
            _blame(running, hook, ex, e)
            raise
        if response.changed:
            self.metrics.rewritten(ex.api)
        if isinstance(response, FetchResponse) and self.access_log is not None and self.access_log.enabled:
            ex.partitions = self._listing(response.view)

    def stream_fetch(self, conn: ChainConnection, ex: Exchange, size: int) -> FetchStreamer | None:
        """A response the policies asked to collect begins, ``size`` bytes (its size prefix): if it is a Fetch's
        and every policy that asked to see it offers to read it as it streams
        (:meth:`~proxy.core.policy.Policy.stream_fetch`), their ``start`` terms run (before any byte goes out)
        and the walk to stream it through is returned (KIP-951 endpoints rewritten as ``ex.streamer`` does),
        watched for them; else None: it is collected (:meth:`on_response`)."""
        if ex.header.api_key != _FETCH or size <= 4:  # (no body: malformed, for the collected decode to say so)
            return None
        states = conn.states
        streamers = self._fetch_streamers
        offers: list[tuple[Policy, Streamed]] = []
        policy: Policy | None = None
        try:
            for policy, state in zip(ex.policies, ex.states, strict=False):
                if state is None:
                    continue
                if policy not in streamers:
                    return None
                terms = policy.stream_fetch(ex, size, states[policy], state)
                if terms is None:
                    return None
                offers.append((policy, terms))
            offers.reverse()  # responses go back towards the client: the policy nearest the broker first
            floor = 0
            for running, terms in offers:
                policy = running  # a failure is its own
                if terms.start is not None:
                    floor = max(floor, terms.start())
        except Exception as e:
            _blame(policy, "stream_fetch", ex, e)
            raise
        walk = ex.streamer(size - 4) if ex.streamer is not None else FetchStreamer(ex.header.api_version, size - 4)
        assert isinstance(walk, FetchStreamer)
        walk.watch(floor)
        ex.streamed = tuple(offers)
        return walk

    def on_streamed(self, conn: ChainConnection, ex: Exchange, walk: FetchStreamer) -> None:
        """A Fetch response walked for the policies (:meth:`stream_fetch`) went out whole: their ``finish``
        terms, the access log's fields."""
        policy: Policy | None = None
        try:
            for running, terms in ex.streamed:
                policy = running  # a failure is its own
                if terms.finish is not None:
                    terms.finish(walk)
        except Exception as e:
            _blame(policy, "stream_fetch.finish", ex, e)
            raise
        seen = walk.seen or ()
        errors = [s.error_code for s in seen if s.error_code]
        if walk.error_code:
            errors.insert(0, walk.error_code)
        ex.error_codes = errors
        ex.decoded = True
        if self.access_log is not None and self.access_log.enabled:
            ex.partitions = self._partitions((s.topic, s.partition, s.records_size) for s in seen)

    def _send_again(self, conn: ChainConnection, ex: Exchange, asking: int) -> None:
        """The policy at ``asking`` (in ``ex.policies``) asked for ``ex.frame`` to go upstream instead of the
        response: the policies after it handle that frame as a new request (their earlier states dropped). One of
        them answering it itself makes that answer the client's reply; one asking for work of its own first is a
        failure of the policy that asked to send again (nothing waits between two attempts of one request)."""
        policy = ex.policies[asking]
        del ex.states[asking + 1 :]
        if len(ex.states) == len(ex.policies):
            return
        try:
            self.on_request(conn, ex)
        except Rejected as e:
            raise PolicyFailed(policy.name, "on_response", ex, e) from e
        if ex.pending is not None:
            raise PolicyFailed(policy.name, "on_response", ex, RuntimeError("a request sent again waits for work"))
        if ex.answer is not None:
            ex.resend = False
            ex.reply, ex.client_bytes = [ex.answer], len(ex.answer)
            ex.answer = None

    def _listing(self, view: FetchResponseView) -> Listing:
        """A collected Fetch response's listing for the access log: one assembled from kept encodings is listed
        from the keys it was assembled from, naming its topics only (:class:`~proxy.accesslog.KeptListing`)."""
        encoded = view.encoded
        if encoded is None:
            return self._partitions(view.partition_sizes())
        unknown: list[bytes] = []
        labels = {topic: topic if isinstance(topic, str) else self._label(topic, unknown) for topic in encoded.topics}
        if unknown:
            self.names.note(unknown)  # known by the next response
        return KeptListing(encoded.partitions, labels, encoded.record_sizes)

    def _label(self, topic_id: bytes, unknown: list[bytes]) -> str:
        """A topic id's name in the access log, or its label while unknown (then added to ``unknown``)."""
        name = self.names.get(topic_id)
        if name:
            return name
        unknown.append(topic_id)
        return self.names.label(topic_id)

    def _partitions(self, sent: Iterable[tuple[TopicKey, int, int]]) -> list[tuple[str, int, int]]:
        """Record bytes sent per partition (topic key, partition, bytes), for the access log, by topic name.
        Partitions with none count too: the analytics' empty fetches and partitions without bytes are how
        starvation shows (analytics/aggregates.py)."""
        out: list[tuple[str, int, int]] = []
        unknown: list[bytes] = []
        # Partitions come grouped by topic: each topic is named once, and its rows are copied at C level (10,000
        # partitions a response: a Python loop over them cost ~1.5 ms a line).
        for topic, rows in groupby(sent, _TOPIC):
            if isinstance(topic, str):
                out.extend(cast(Iterator[tuple[str, int, int]], rows))  # by name already
                continue
            label = self._label(topic, unknown)
            group = list(rows)
            out.extend(zip(repeat(label), map(_PARTITION, group), map(_SIZE, group), strict=False))
        if unknown:
            self.names.note(unknown)  # known by the next response
        return out


def _arrive(terms: tuple[tuple[Policy, ArrivalTerms], ...], header: RequestHeader, api: str, size: int,
            info: ConnectionInfo | None, expects_response: bool) -> tuple[Mapping[str, Any], dict[Policy, Any] | None]:
    """Each policy's ``arrival`` terms on a request as it arrives: the access-log fields they add, and the states
    of those that need it read as an Exchange (None: none does). A policy's that raises is PolicyFailed."""
    log: Mapping[str, Any] = NO_FIELDS
    arrived: dict[Policy, Any] | None = None
    for policy, arrival in terms:
        try:
            noted = arrival(header, size, info, expects_response)
        except Exception as e:
            failed = PolicyFailed(policy.name, "arrival", None, e)
            failed.api, failed.version = api, header.api_version
            raise failed from e
        if noted is None:
            continue
        if noted.log:
            log = {**log, **noted.log} if log else noted.log
        if noted.state is not None:
            if arrived is None:
                arrived = {}
            arrived[policy] = noted.state
    return log, arrived


def _blame(policy: Policy | None, hook: str, ex: Exchange, error: Exception) -> None:
    """Raise PolicyFailed for ``error`` raised in ``policy``'s ``hook``, unless it is one of the chain's defined
    outcomes (a rejection; a CodecError of a response, whose bytes a policy reads lazily: the caller's malformed
    response) or no policy was running (the chain's own)."""
    if policy is not None and not isinstance(error, Rejected) and not (
            isinstance(error, CodecError) and hook in _RESPONSE_HOOKS):
        raise PolicyFailed(policy.name, hook, ex, error) from error


#: the hooks that read the broker's response, whose bytes are decoded as they are read
_RESPONSE_HOOKS = frozenset({"on_response", "on_sent"})


def _span(versions: range) -> str:
    return f"{versions.start}-{versions.stop - 1}" if versions else "none"
