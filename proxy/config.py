"""Sluice's settings: defaults <- TOML file <- environment, typed and validated by pydantic v2.

Sources, later wins:

1. defaults (the field defaults below; ``config/sluice.toml`` documents each one);
2. a TOML file (``load_settings(path)``), read with :mod:`tomllib`;
3. environment variables ``SLUICE_<SECTION>__<KEY>`` (double underscore between the levels), e.g.
   ``SLUICE_UPSTREAM__BOOTSTRAP_SERVERS=127.0.0.1:9092,127.0.0.1:9093``, ``SLUICE_LISTEN__BOOTSTRAP_PORT=0``.
   Lists are comma-separated; booleans accept true/false/1/0/yes/no/on/off. A ``SLUICE_`` variable *with* a
   ``__`` must name a real key (a typo is an error, not silently ignored); variables without ``__``
   (``SLUICE_CONFIG``, anything rig/ or the tests use) are not overrides and are left alone.
4. the state file ``admin.state_file`` (:func:`apply_state_file`; ``sluice run`` and SIGHUP reloads, not
   ``load_settings``): the dynamic sections (``[throttle]``, ``[size_limit]``) as last changed through the admin
   API, each replacing the whole section. Sluice writes it (:func:`save_state_section`) atomically.

Every problem becomes one :class:`ConfigError` whose ``str()`` is a single line naming the dotted key, the
reason and where the value came from, e.g. ``listen.bootstrap_port: input should be less than or equal to
65535, got 70000 (in sluice.toml)``; the CLI prints it and exits 2.

Models are strict (a TOML string ``"19092"`` is not a port) and forbid unknown keys, so a misspelt key fails
loudly instead of silently keeping its default. They are frozen: code that needs other settings makes a copy.

Copies for tests::

    s = load_settings(None, env={})
    # validated, dotted keys:
    s2 = s.with_overrides({"listen.bootstrap_port": 0, "upstream.bootstrap_servers": [broker]})
    # NOT validated, one nested model_copy per section:
    s3 = s.model_copy(update={"listen": s.listen.model_copy(update={"bootstrap_port": 0})})

Adding a section (later: ``[[size_limit]]``, ``[sessions]``, ``[throttle]``) is one model class deriving
from :class:`Section` plus one field on :class:`Settings`, e.g.
``sessions: SessionsSettings = SessionsSettings()`` or, for an array of tables,
``size_limit: list[SizeLimitRule] = []``. Env overrides, unknown-key errors and error messages then work
for it without further code (env overrides reach scalar and list-of-scalar keys only).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
import re
import tempfile
import tomllib
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

__all__ = [
    "AccessLogKafkaSettings",
    "AdminSettings",
    "ConfigError",
    "LimitsSettings",
    "ListenSettings",
    "LoggingSettings",
    "Section",
    "SessionsSettings",
    "Settings",
    "SharingSettings",
    "ShutdownSettings",
    "ThrottleSettings",
    "UpstreamSettings",
    "apply_state_file",
    "check_topic_name",
    "check_topic_or_glob",
    "load_settings",
    "parse_host_port",
    "read_state",
    "save_state_section",
    "topic_is_glob",
    "write_state",
]

ENV_PREFIX = "SLUICE_"
ENV_SEPARATOR = "__"


class ConfigError(Exception):
    """An invalid setting. ``str(e)`` is one line: ``<key>: <reason> (<source>)``.

    ``key`` is the dotted key (``"listen.bootstrap_port"``, ``"upstream.bootstrap_servers[1]"``) or ``""``
    when the problem is the file itself (missing, not TOML). ``source`` says where the value came from:
    ``"in FILE"``, ``"from env SLUICE_..."``, ``"from override"`` or ``""``.
    """

    def __init__(self, key: str, reason: str, source: str = "") -> None:
        # One line, always: the CLI prints str(e) as is and operators grep for it.
        self.key = key
        self.reason = " ".join(reason.split())
        self.source = source
        text = f"{key}: {self.reason}" if key else self.reason
        if source:
            text += f" ({source})"
        super().__init__(text)


class KeyedValueError(ValueError):
    """Raised by cross-field validators to blame a specific key (relative to the model that raised it).

    pydantic reports a model validator's error at the model's location (the whole section); carrying the key
    in the exception lets :class:`ConfigError` still name the field the operator should change.
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason


# ----------------------------------------------------------------------------------------- value types

_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_IPV6_RE = re.compile(r"^[0-9A-Za-z:.%]+$")


def parse_host_port(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (IPv6 as ``[addr]:port``) into ``(host, port)``; ValueError says what is wrong."""
    s = text.strip()
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or s[end + 1 : end + 2] != ":":
            raise ValueError(f"expected [ipv6]:port, got {text!r}")
        host, port_s = s[1:end], s[end + 2 :]
        host_ok = bool(_IPV6_RE.match(host))
    else:
        host, sep, port_s = s.rpartition(":")
        if not sep:
            raise ValueError(f"expected host:port, got {text!r}")
        if ":" in host:
            raise ValueError(f"IPv6 addresses need brackets ([addr]:port), got {text!r}")
        host_ok = bool(_HOSTNAME_RE.match(host))
    if not host_ok:
        raise ValueError(f"invalid host in {text!r}")
    if not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise ValueError(f"port must be 1..65535 in {text!r}")
    return host, int(port_s)


def _check_host(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be a non-empty host name or address without spaces")
    return value


def _hosts_overlap(a: str, b: str) -> bool:
    wildcards = ("0.0.0.0", "::", "")
    return a == b or a in wildcards or b in wildcards


def _check_finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _check_host_port(value: str) -> str:
    parse_host_port(value)
    return value.strip()  # stored normalised, so later code can rely on parse_host_port(s) round-tripping


# An element type (not a list validator) so errors name the entry: upstream.bootstrap_servers[1].
HostPort = Annotated[str, AfterValidator(_check_host_port)]
# 0 means "let the OS pick a free port" (tests, and several proxies on one host).
Port = Annotated[int, Field(ge=0, le=65535)]
Seconds = Annotated[float, Field(gt=0)]
# Kafka frames carry an int32 length, so nothing larger can ever be valid.
FrameBytes = Annotated[int, Field(gt=0, le=2**31 - 1)]


# -------------------------------------------------------------------------------------------- sections


class Section(BaseModel):
    """Base of every settings model: strict types, unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=True)


TlsVersion = Literal["TLSv1.2", "TLSv1.3"]


def _check_file(value: str) -> str:
    """A path that must name a readable file (empty = not set)."""
    if not value:
        return value
    if value != value.strip() or "\0" in value:
        raise ValueError("must be a file path without leading or trailing spaces")
    if not os.path.isfile(value):
        raise ValueError(f"no such file: {value}")
    if not os.access(value, os.R_OK):
        raise ValueError(f"cannot read {value}")
    return value


FilePath = Annotated[str, AfterValidator(_check_file)]


def _check_pair(cert_file: str, key_file: str, prefix: str = "") -> None:
    """A certificate and its key are given together or not at all."""
    if bool(cert_file) != bool(key_file):
        raise KeyedValueError(f"{prefix}key_file" if cert_file else f"{prefix}cert_file",
                              f"{prefix}cert_file and {prefix}key_file go together")


class ServerTlsSettings(Section):
    """``[listen.tls]``: TLS on the client-facing listeners (bootstrap and every broker port). The files are
    re-read when they change (checked every ``reload_interval_s``) and on SIGHUP: new connections get the new
    certificate, open ones keep theirs. Needs a restart to turn on or off."""

    enabled: bool = Field(default=False, description="Clients connect with TLS (security.protocol SSL or SASL_SSL).")
    cert_file: FilePath = Field(default="", description="PEM certificate chain the listeners present (leaf first).")
    key_file: FilePath = Field(default="", description="PEM private key of cert_file (unencrypted, or see "
                                                       "key_password_file).")
    key_password_file: FilePath = Field(default="", description="File holding the key's password (empty = the key "
                                                                "is not encrypted).")
    ca_file: FilePath = Field(default="", description="PEM CA bundle client certificates must chain to (mTLS); "
                                                      "needed when client_auth is not none.")
    client_auth: Literal["none", "requested", "required"] = Field(
        default="none", description="Client certificates (Kafka's ssl.client.auth): none, requested (verified "
                                    "when sent), required (mTLS: a client without one is refused).")
    min_version: TlsVersion = Field(default="TLSv1.2", description="Lowest TLS version accepted.")
    max_version: TlsVersion = Field(default="TLSv1.3", description="Highest TLS version accepted.")
    reload_interval_s: Annotated[float, Field(ge=0, le=86_400)] = Field(
        default=30.0, description="How often the certificate files are checked for changes; 0 = only on SIGHUP.")

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.enabled:
            if not self.cert_file:
                raise KeyedValueError("cert_file", "is needed when TLS is enabled")
            if not self.key_file:
                raise KeyedValueError("key_file", "is needed when TLS is enabled")
        if self.client_auth != "none" and not self.ca_file:
            raise KeyedValueError("ca_file", f"is needed with client_auth = {self.client_auth!r} (the CA bundle "
                                             "client certificates are verified against)")
        if self.min_version > self.max_version:
            raise KeyedValueError("max_version", f"is below min_version ({self.min_version})")
        return self


class ListenerSettings(Section):
    """One ``[[listen.listeners]]`` entry: settings of the listeners whose name matches ``listener`` (first match
    wins), over ``[listen]``/``[listen.tls]``'s."""

    listener: str = Field(description='Listener name or glob: "bootstrap", "broker-3", "broker-*".')
    proxy_protocol: Literal["off", "v1", "v2", "any"] | None = Field(
        default=None, description="PROXY protocol on these listeners (default: listen.proxy_protocol).")
    cert_file: FilePath = Field(default="", description="Certificate these listeners present instead of "
                                                       "listen.tls.cert_file (with key_file).")
    key_file: FilePath = Field(default="", description="Private key of cert_file.")

    @field_validator("listener")
    @classmethod
    def _listener(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9*?\[\]!-]+", value):
            raise ValueError('must be "bootstrap", "broker-N" or a glob of them, e.g. "broker-*"')
        return value

    @model_validator(mode="after")
    def _pair(self) -> Self:
        _check_pair(self.cert_file, self.key_file)
        return self


class ClientTlsSettings(Section):
    """``[upstream.tls]``: TLS from Sluice to the brokers (also for Sluice's own Metadata lookups)."""

    enabled: bool = Field(default=False, description="Connect to the brokers with TLS (their SSL / SASL_SSL "
                                                     "listener).")
    ca_file: FilePath = Field(default="", description="PEM CA bundle the brokers' certificates must chain to "
                                                      "(empty = the system's CAs).")
    check_hostname: bool = Field(default=True, description="Verify that a broker's certificate names the host "
                                                           "Sluice connects to (Kafka's "
                                                           "ssl.endpoint.identification.algorithm=https).")
    cert_file: FilePath = Field(default="", description="Client certificate Sluice presents (brokers with "
                                                       "ssl.client.auth), with key_file.")
    key_file: FilePath = Field(default="", description="Private key of cert_file.")
    key_password_file: FilePath = Field(default="", description="File holding the key's password.")
    min_version: TlsVersion = Field(default="TLSv1.2", description="Lowest TLS version Sluice offers.")

    @model_validator(mode="after")
    def _pair(self) -> Self:
        _check_pair(self.cert_file, self.key_file)
        return self


class UpstreamSaslSettings(Section):
    """``[upstream.sasl]``: Sluice's own SASL identity for the requests it makes itself (Metadata lookups of the
    brokers and of topic names) when the brokers' listener requires SASL. Clients' credentials are never used:
    they are relayed untouched."""

    mechanism: Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="", description='Mechanism of Sluice\'s own authentication; "" = none.')
    username: str = Field(default="", description="Sluice's user.")
    # repr=False: never in a repr or a ConfigError message
    password: str = Field(default="", repr=False, description="Its password (set it through "
                                                              "SLUICE_UPSTREAM__SASL__PASSWORD, or password_file).")
    password_file: FilePath = Field(default="", description="File holding the password; exclusive with password.")

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.password and self.password_file:
            raise KeyedValueError("password_file", "set either password or password_file, not both")
        if self.mechanism and not self.username:
            raise KeyedValueError("username", f"is needed with mechanism = {self.mechanism!r}")
        if self.mechanism and not (self.password or self.password_file):
            raise KeyedValueError("password", f"is needed with mechanism = {self.mechanism!r} (or password_file)")
        return self

    def secret(self) -> str:
        """The password in force (read from password_file now, if that is where it is)."""
        if not self.password_file:
            return self.password
        with open(self.password_file, encoding="utf-8") as fh:
            return fh.read().strip()


class UpstreamSettings(Section):
    """Where the real Kafka cluster is."""

    bootstrap_servers: list[HostPort] = Field(
        default_factory=lambda: ["127.0.0.1:9092"],
        description="Upstream bootstrap brokers, host:port; the rest of the cluster is learnt from Metadata.",
    )
    connect_timeout_s: Seconds = Field(default=10.0, description="TCP connect timeout to an upstream broker.")
    tls: ClientTlsSettings = Field(default_factory=lambda: ClientTlsSettings(),
                                   description="TLS to the brokers (off by default).")
    sasl: UpstreamSaslSettings = Field(default_factory=lambda: UpstreamSaslSettings(),
                                       description="Sluice's own SASL identity for its lookups (off by default).")

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one host:port")
        return value

    @field_validator("connect_timeout_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return _check_finite(value)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``bootstrap_servers`` parsed into ``(host, port)`` pairs."""
        return [parse_host_port(s) for s in self.bootstrap_servers]


class ListenSettings(Section):
    """Where clients connect. Changing these needs a restart."""

    host: str = Field(default="127.0.0.1", description="Address the bootstrap and broker listeners bind.")
    bootstrap_port: Port = Field(default=19092, description="Port clients bootstrap from.")
    broker_port_base: Port = Field(
        default=19093,
        description="Upstream broker node N is served on broker_port_base + N; 0 = free port per node.",
    )
    advertised_host: str = Field(
        default="127.0.0.1", description="Host clients are told in Metadata/FindCoordinator/DescribeCluster."
    )
    proxy_protocol: Literal["off", "v1", "v2", "any"] = Field(
        default="off", description="Read a PROXY protocol header (HAProxy's v1 / v2 / either) at the start of "
                                   "every client connection: behind a load balancer the real client address is "
                                   "then the one logged, selected on and limited. A connection without one is "
                                   "closed.")
    tls: ServerTlsSettings = Field(default_factory=lambda: ServerTlsSettings(),
                                   description="TLS for clients (off by default).")
    listeners: list[ListenerSettings] = Field(default_factory=list,
                                              description="Per-listener settings, first match wins.")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return _check_host(value)

    @field_validator("advertised_host")
    @classmethod
    def _advertised(cls, value: str) -> str:
        _check_host(value)
        # Clients would try to connect to the wildcard address itself; this is the classic
        # advertised.listeners mistake, so refuse it here rather than let clients fail later.
        if value in ("0.0.0.0", "::", "[::]"):
            raise ValueError("must be an address clients can connect to, not a wildcard bind address")
        return value

    @field_validator("broker_port_base")
    @classmethod
    def _base(cls, value: int, info: ValidationInfo) -> int:
        bootstrap = info.data.get("bootstrap_port")
        # base + node id must never land on the bootstrap port; node ids are only known at run time, so the
        # one rule that is always safe is "bootstrap below the broker range".
        if value and bootstrap and bootstrap >= value:
            raise ValueError(
                f"must be above listen.bootstrap_port ({bootstrap}): broker node N listens on base+N "
                "and must not collide with the bootstrap port"
            )
        return value


class LimitsSettings(Section):
    """Memory and frame bounds (the proxy never buffers without bound)."""

    max_frame_bytes: FrameBytes = Field(
        default=104857600,
        description="Largest frame accepted from either side (broker: socket.request.max.bytes).",
    )
    write_high_water_bytes: Annotated[int, Field(gt=0)] = Field(
        default=4194304, description="Pause reading the other side when a write buffer grows past this."
    )
    write_low_water_bytes: Annotated[int, Field(ge=0)] = Field(
        default=1048576, description="Resume reading once the write buffer has drained below this."
    )
    request_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=30.0,
        description="Close a client connection whose request frame stays incomplete this long after its first "
        "byte (Kafka clients' request.timeout.ms default: 30 s).",
    )

    max_connections: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Client connections open at once; more are closed at accept (Kafka's "
                               "max.connections). 0 = no bound.")
    max_connections_per_address: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Client connections open at once from one client address (Kafka's "
                               "max.connections.per.ip). 0 = no bound.")
    max_inflight_requests: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Requests a connection may have owed a response; then it is not read until one "
                               "goes out (Kafka's channel muting, queued.max.requests). 0 = no bound.")
    idle_timeout_s: Annotated[float, Field(ge=0, le=86_400)] = Field(
        default=600.0, description="Close a client connection with nothing in flight and no bytes from the client "
                                   "for this long (Kafka's connections.max.idle.ms, 10 min). 0 = never.")

    @field_validator("write_low_water_bytes")
    @classmethod
    def _low_below_high(cls, value: int, info: ValidationInfo) -> int:
        high = info.data.get("write_high_water_bytes")
        if high is not None and value >= high:
            raise ValueError(f"must be below limits.write_high_water_bytes ({high})")
        return value


class ShutdownSettings(Section):
    """Graceful shutdown."""

    drain_timeout_s: Annotated[float, Field(ge=0)] = Field(
        default=10.0,
        description="On SIGTERM, how long in-flight requests may take before connections are closed.",
    )

    @field_validator("drain_timeout_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return _check_finite(value)


class AdminSettings(Section):
    """The admin HTTP server (/metrics, /healthz, /readyz, later /throttles)."""

    enabled: bool = Field(default=True, description="Serve the admin HTTP endpoints.")
    host: str = Field(default="127.0.0.1", description="Admin bind address.")
    port: Port = Field(default=9644, description="Admin port; 0 = a free port.")
    # repr=False keeps the token out of reprs and ConfigError messages.
    token: str = Field(
        default="", repr=False, description="Bearer token for mutating endpoints (set it from the environment, "
                                            "SLUICE_ADMIN__TOKEN, or use token_file); empty = no check."
    )
    token_file: FilePath = Field(default="", description="File holding the bearer token (e.g. a mounted secret); "
                                                         "exclusive with token.")
    auth_reads: bool = Field(default=False, description="Require the token for GET endpoints too (/healthz and "
                                                        "/readyz stay open for probes).")
    tls_cert_file: FilePath = Field(default="", description="Serve the admin API over HTTPS with this PEM "
                                                           "certificate (with tls_key_file).")
    tls_key_file: FilePath = Field(default="", description="Private key of tls_cert_file.")
    state_file: str = Field(
        default="",
        description="File where admin API changes to [throttle] and [size_limit] are saved (atomically) and "
                    "re-applied over the config file at start-up and on SIGHUP; empty = not saved.",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return _check_host(value)

    @field_validator("token")
    @classmethod
    def _token(cls, value: str) -> str:
        # A token with spaces could never be sent in an "Authorization: Bearer <token>" header.
        if value != value.strip() or any(c.isspace() for c in value):
            raise ValueError("must not contain whitespace")
        return value

    @model_validator(mode="after")
    def _token_source(self) -> Self:
        if self.token and self.token_file:
            raise KeyedValueError("token_file", "set either token or token_file, not both")
        if self.token_file:
            read_token_file(self.token_file)
        _check_pair(self.tls_cert_file, self.tls_key_file, "tls_")
        return self

    def bearer_token(self) -> str:
        """The token in force: ``token``, or the contents of ``token_file`` (read now)."""
        return read_token_file(self.token_file) if self.token_file else self.token

    @field_validator("state_file")
    @classmethod
    def _state_file(cls, value: str) -> str:
        if value and (value != value.strip() or "\0" in value):
            raise ValueError("must be a file path without leading or trailing spaces (empty = not saved)")
        if value.endswith(("/", os.sep)):
            raise ValueError(f"must name a file, not a directory, got {value!r}")
        return value


def read_token_file(path: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace and a final newline stripped). ValueError (never
    echoing the contents) if it is empty or holds whitespace inside."""
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyedValueError("token_file", f"cannot read {path}: {exc}") from None
    if not token or any(c.isspace() for c in token):
        raise KeyedValueError("token_file", f"{path} must hold one token without whitespace")
    return token


LogLevel = Literal["debug", "info", "warning", "error"]

#: librdkafka properties the access-log sink sets from its own keys; ``properties`` may not set them again (one
#: place per setting, and the bound on the buffer must stay the one ``buffer_events``/``buffer_bytes`` say).
KAFKA_SINK_MANAGED = {
    "bootstrap.servers": "bootstrap_servers",
    "queue.buffering.max.messages": "buffer_events",
    "queue.buffering.max.kbytes": "buffer_bytes",
    "linger.ms": "linger_ms",
    "compression.type": "compression",
    "compression.codec": "compression",
    "message.timeout.ms": "delivery_timeout_s",
    "delivery.timeout.ms": "delivery_timeout_s",
    "delivery.report.only.error": "",
    "dr_cb": "",
    "dr_msg_cb": "",
    "on_delivery": "",
    "error_cb": "",
    "logger": "",
}
#: Substrings of librdkafka property names whose values are secrets (never logged).
_SECRET_PROPERTY_PARTS = ("password", "secret", "jaas", "token", ".pem", "credentials")


def check_topic_name(text: str) -> str:
    """A Kafka topic name (Topic.java's rules), not a glob."""
    if topic_is_glob(text):
        raise ValueError(f"{text!r} is a glob; a topic name is needed here")
    return check_topic_or_glob(text)


class AccessLogKafkaSettings(Section):
    """``[logging.access_log_kafka]``: the access log also produced to a Kafka topic (the same JSON line per request,
    the same schema), from a bounded buffer that never blocks the proxy: when the buffer is full the event is
    dropped and counted (``sluice_access_log_dropped_total``). Needs a restart."""

    enabled: bool = Field(default=False, description="Produce every access-log event to `topic`.")
    bootstrap_servers: list[HostPort] = Field(
        default_factory=list,
        description="The cluster the events go to, host:port; empty = the upstream cluster "
                    "(upstream.bootstrap_servers).",
    )
    topic: str = Field(default="sluice-access-log", description="Topic the events are produced to.")
    key: str = Field(
        default="",
        description="Message key of every event: names this Sluice process in the analytics (its `source`, as the "
                    "file name does for files) and keeps its events in one partition, in order; empty = "
                    '"<hostname>:<pid>".',
    )
    buffer_events: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=100_000, description="Events held while the cluster is slow or down; beyond it events are dropped."
    )
    buffer_bytes: Annotated[int, Field(ge=1024, le=2**31 - 1)] = Field(
        default=67_108_864, description="Bytes held (the same buffer, bounded in bytes too); beyond it events "
                                        "are dropped."
    )
    linger_ms: Annotated[int, Field(ge=0, le=60_000)] = Field(
        default=100, description="How long events wait to be batched before they are sent."
    )
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        default="lz4", description="Batch compression (JSON lines compress about 10x)."
    )
    delivery_timeout_s: Annotated[float, Field(gt=0, le=86_400)] = Field(
        default=120.0, description="An event the cluster has not taken this long after it was buffered is "
                                   "dropped (counted as delivery_failed)."
    )
    flush_timeout_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        default=5.0, description="At shutdown, how long buffered events may take to be sent; the rest are "
                                 "dropped (counted as stopped)."
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Further librdkafka producer properties, e.g. security.protocol, sasl.mechanism, "
                    "sasl.username, sasl.password, ssl.ca.location (checked when Sluice starts).",
    )

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_name(value)

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if value != value.strip():
            raise ValueError("must not start or end with spaces")
        return value

    @field_validator("delivery_timeout_s", "flush_timeout_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return _check_finite(value)

    @field_validator("properties")
    @classmethod
    def _properties(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name in KAFKA_SINK_MANAGED:
                own = KAFKA_SINK_MANAGED[name]
                raise KeyedValueError(
                    name, f"is set by Sluice{f' from logging.access_log_kafka.{own}' if own else ''}; "
                          "it cannot be overridden")
            if not name or any(c.isspace() for c in name):
                raise ValueError(f"{name!r} is not a property name")
        return value

    def redacted_properties(self) -> dict[str, str]:
        return {k: "***" if any(p in k.lower() for p in _SECRET_PROPERTY_PARTS) else v
                for k, v in self.properties.items()}


class LoggingSettings(Section):
    """Operational log (stderr) and access log."""

    level: LogLevel = Field(default="info", description="Operational log level.")
    access_log: str = Field(
        default="-", description='Access log destination: "-" stdout, "off", or a file path.'
    )
    format: Literal["json", "console"] = Field(default="json", description="Operational log format.")
    # A factory: the topic check it runs is defined further down this module.
    access_log_kafka: AccessLogKafkaSettings = Field(
        default_factory=lambda: AccessLogKafkaSettings(),
        description="The access log also produced to a Kafka topic (off by default).")

    @field_validator("level", "format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("access_log")
    @classmethod
    def _access_log(cls, value: str) -> str:
        if not value.strip():
            raise ValueError('must be "-" (stdout), "off", or a file path')
        return value


def _check_network(value: str | None) -> str | None:
    if value is None:
        return value
    import ipaddress

    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"must be an IP address or a CIDR network (e.g. 10.1.0.0/16), got {value!r}") from None
    return value


Network = Annotated[str | None, AfterValidator(_check_network)]


class BudgetSettings(Section):
    """One ``[[size_limit.budgets]]`` entry (KIP-74). The first entry that matches a fetch applies; an entry's
    selectors (client_id, principal, client_address) must all match."""

    client_id: str | None = Field(
        default=None, description='client.id glob ("*" = every consumer); exclusive with replicas.'
    )
    principal: str | None = Field(
        default=None, description="SASL principal glob (the authenticated user); exclusive with replicas.")
    client_address: Network = Field(
        default=None, description="Client IP address or CIDR network (the PROXY protocol's source when read); "
                                  "exclusive with replicas.")
    replicas: bool = Field(default=False, description="Applies to replica fetchers (replica_id >= 0).")
    fetch_max_bytes: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = Field(
        default=None,
        description="Response budget in bytes; 0 = none. Default: 10 MiB for replicas "
        "(replica.fetch.response.max.bytes), else 0.",
    )
    partition_max_bytes: Annotated[int, Field(ge=0, le=2**31 - 1)] = Field(
        default=0, description="Per-partition cap in bytes; 0 = none."
    )

    @model_validator(mode="after")
    def _selector(self) -> Self:
        clients = self.client_id is not None or self.principal is not None or self.client_address is not None
        if clients == self.replicas:
            raise KeyedValueError(
                "client_id", "set client selectors (client_id, principal, client_address) or replicas = true, "
                             "exactly one of the two"
            )
        return self


class SizeLimitSettings(Section):
    """Response-size limiting (KIP-74). Changeable at run time (admin API PUT /size-limits, SIGHUP)."""

    budgets: list[BudgetSettings] = Field(default_factory=list, description="Budget rules, first match wins.")
    fairness: Literal["round-robin", "off"] = Field(
        default="round-robin", description="Rotate partitions that returned data to the back, per connection."
    )
    global_max_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Bound on response bytes held in Sluice at once; 0 = none."
    )


class ThrottleTopicSettings(Section):
    """One ``[[throttle.topics]]`` entry: which of a topic's replicas are throttled (KIP-73's
    ``leader/follower.replication.throttled.replicas`` syntax)."""

    topic: str = Field(
        description='Topic name, or a glob over topic names ("orders-*", "*"): *, ?, [...] as in fnmatch, '
                    "case-sensitive. An exact name wins over globs; among globs the first in file order wins.",
    )
    replicas: str = Field(
        default="*",
        description='"*" (all partitions, every fetcher) or "partition:fetcher,..." (fetcher = broker id).',
    )

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_or_glob(value)

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: str) -> str:
        value = value.strip()
        if value in ("*", ""):  # Kafka: "" = none, "*" = all
            return value
        for item in value.split(","):
            if not _REPLICA_ITEM.fullmatch(item.strip()):
                raise ValueError(
                    f'{item.strip()!r} is not "partition:broker" (e.g. "0:101,1:102"); use "*" for all'
                )
        return value


_REPLICA_ITEM = re.compile(r"[0-9]+:[0-9]+")

# Kafka's rules for topic names (clients/.../common/internals/Topic.java, validate()): LEGAL_CHARS
# "[a-zA-Z0-9._-]", at most MAX_NAME_LENGTH = 249 characters, not empty, and neither "." nor "..".
TOPIC_MAX_LENGTH = 249
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_LEGAL = "only ASCII letters, digits, '.', '_' and '-' occur in topic names"
# fnmatch's syntax. None of these can occur in a topic name, so an entry is a glob exactly when it has one.
_GLOB_CHARS = "*?["


def topic_is_glob(text: str) -> bool:
    """Whether a ``[[throttle.topics]]`` topic is a glob (has ``*``, ``?`` or ``[``) rather than a topic name."""
    return any(c in _GLOB_CHARS for c in text)


def check_topic_or_glob(text: str) -> str:
    """A ``[[throttle.topics]]`` topic: a Kafka topic name (Topic.java's rules) or an fnmatch glob that can match
    one: ``*`` (any run), ``?`` (one character), ``[...]``/``[!...]`` (one character in / not in a set, ``a-z``
    ranges). ValueError naming the problem otherwise, e.g. a character no topic name has (a literal that could
    never match is a typo, not a pattern: silently matching nothing is what this check exists to prevent)."""
    if not text:
        raise ValueError('must be a topic name or a glob of topic names, e.g. "orders" or "orders-*"')
    shown = repr(text) if len(text) <= 60 else repr(text[:57]) + "..."  # the message stays one readable line
    shortest = 0  # the length of the shortest name the glob matches (each * matches the empty string)
    i = 0
    while i < len(text):
        c = text[i]
        if c == "[":
            end = text.find("]", i + 1)
            if end < 0:
                raise ValueError(f"{shown}: the '[' at position {i} is never closed (a set is [...] or [!...])")
            members = text[i + 1 : end]
            members = members.removeprefix("!")
            if not members:
                raise ValueError(f"{shown}: the set at position {i} is empty")
            for m in members:
                if m not in _TOPIC_CHARS:
                    raise ValueError(f"{shown}: {m!r} in the set at position {i} can never match: {_LEGAL}")
            for j in range(1, len(members) - 1):
                if members[j] == "-" and members[j - 1] > members[j + 1]:  # fnmatch drops reversed ranges
                    raise ValueError(f"{shown}: the range {members[j - 1 : j + 2]!r} is empty")
            shortest += 1
            i = end
        elif c == "?":
            shortest += 1
        elif c == "]":
            raise ValueError(f"{shown}: ']' at position {i} closes no '['")
        elif c != "*":
            if c not in _TOPIC_CHARS:
                raise ValueError(f"{shown} is neither a topic name nor a glob of one: {c!r} at position {i} "
                                 f"cannot occur in a topic name ({_LEGAL}; globs add *, ? and [...])")
            shortest += 1
        i += 1
    if shortest > TOPIC_MAX_LENGTH:
        raise ValueError(f"{shown} is longer than the {TOPIC_MAX_LENGTH} characters a topic name may have"
                         if not topic_is_glob(text) else
                         f"{shown} can never match: every name it matches is longer than the "
                         f"{TOPIC_MAX_LENGTH} characters a topic name may have")
    if text in (".", ".."):
        raise ValueError(f"{shown} cannot be a topic name (Kafka forbids '.' and '..')")
    return text


def _one_entry_per_topic(section: str, topics: list[str], hint: str = "") -> None:
    """Two entries with the same topic (or glob) would leave one silently unused: an exact name and the first
    matching glob each pick one entry, entries are never merged (policies/topic_rules.py, TopicRules)."""
    first: dict[str, int] = {}
    for i, topic in enumerate(topics):
        if topic in first:
            raise KeyedValueError(f"topics[{i}].topic", f"{topic!r} is already {section}.topics[{first[topic]}]: one "
                                                        f"entry per topic name or glob{hint}")
        first[topic] = i


class ClientSelectorSettings(Section):
    """A client selector (proxy/core/selectors.py), e.g. one ``[[throttle.consumers]]`` entry: consumers
    (replica_id < 0) a rule applies to; the selectors given must all match."""

    client_id: str | None = Field(default=None, description='client.id glob, e.g. "backfill-*".')
    principal: str | None = Field(default=None, description="SASL principal glob.")
    client_address: Network = Field(default=None, description="Client IP address or CIDR network.")

    @field_validator("client_id", "principal")
    @classmethod
    def _glob(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError('must be a glob, e.g. "backfill-*" ("*" = every consumer)')
        return value

    @model_validator(mode="after")
    def _some(self) -> Self:
        if self.client_id is None and self.principal is None and self.client_address is None:
            raise KeyedValueError("client_id", "set at least one of client_id, principal, client_address")
        return self


class ThrottleSettings(Section):
    """Replication throttles (KIP-73). Changeable at run time (admin API PUT /throttles, SIGHUP)."""

    leader_rate_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Bytes/s bound on throttled partitions in responses to fetchers; 0 = none."
    )
    follower_rate_bytes: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Bytes/s bound on throttled partitions Sluice fetches upstream; 0 = none."
    )
    window_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=1.0, description="Sample window, seconds (replication.quota.window.size.seconds)."
    )
    samples: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=11, description="Samples kept (replication.quota.window.num)."
    )
    topics: list[ThrottleTopicSettings] = Field(default_factory=list, description="Throttled replicas per topic.")
    consumers: list[ClientSelectorSettings] = Field(
        default_factory=list, description="Consumers (by client.id glob) the topic lists also apply to."
    )

    @field_validator("window_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return _check_finite(value)

    @model_validator(mode="after")
    def _one_entry_per_topic(self) -> Self:
        _one_entry_per_topic("throttle", [t.topic for t in self.topics], " (list all its replicas in that entry)")
        return self


class SessionClientSettings(Section):
    """One ``[[sessions.clients]]`` entry: the mode for clients whose client.id matches (first match wins)."""

    client_id: str = Field(description='client.id glob, e.g. "rdkafka*" ("*" = every client).')
    mode: Literal["passthrough", "terminate"] = Field(description="The mode for these clients.")

    @field_validator("client_id")
    @classmethod
    def _glob(cls, value: str) -> str:
        if not value:
            raise ValueError('must be a glob, e.g. "rdkafka*" ("*" = every client)')
        return value


class SessionsSettings(Section):
    """Incremental fetch sessions (KIP-227, proxy/policies/sessions.py, terminate.py). Needs a restart."""

    mode: Literal["passthrough", "terminate"] = Field(
        default="passthrough",
        description="passthrough: relay Fetch sessions untouched. terminate: Sluice owns the sessions on both "
                    "sides: one upstream session per client connection (only changed partitions on the upstream "
                    "link), and it serves the sessions of clients that use them (the Java client, "
                    "kafka-python) itself; session-less clients (librdkafka, aiokafka) get full responses. "
                    "The mode for clients no [[sessions.clients]] entry matches.",
    )
    clients: list[SessionClientSettings] = Field(
        default_factory=list, description="Mode per client.id glob, first match wins."
    )
    cache_slots: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=1000, description="Downstream session cache slots (max.incremental.fetch.session.cache.slots)."
    )
    eviction_age_s: Seconds = Field(
        default=120.0, description="A downstream session idle this long may be evicted by any newcomer."
    )

    @field_validator("eviction_age_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return _check_finite(value)


class SharingTopicSettings(Section):
    """One ``[[sharing.topics]]`` entry: whether a topic (or a family of topics) may be shared by key-hash slices.
    Resolved as ``[[throttle.topics]]`` are: the entry naming a topic exactly wins, else the first glob in file
    order that matches it."""

    topic: str = Field(description='Topic name, or a glob over topic names ("orders-*", "*"): *, ?, [...] as in '
                                   "fnmatch, case-sensitive.")
    shared: bool = Field(default=True, description="Whether these topics are shared (false exempts a topic a glob "
                                                   "would share).")

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_or_glob(value)


#: "index/count": slice index of count even slices of the key-hash space (proxy/policies/sharing/keys.py)
_SLICE = re.compile(r"([0-9]+)/([0-9]+)")
MAX_SLICES = 1 << 16


class SharingStandaloneSettings(Section):
    """One ``[[sharing.standalone]]`` entry: a consumer that uses ``assign()`` (no group protocol) reads only its
    key-hash slice of a topic's partitions. Each partition's slices are the ``count`` even slices; the members of
    one partition must be configured with the same count (one entry each, in every Sluice they use)."""

    client_id: str = Field(description='client.id glob of the consumer, e.g. "etl-1".')
    topic: str = Field(description="The topic (a name, not a glob).")
    partitions: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="The partitions the slice applies to; empty = every partition.")
    slice: str = Field(description='The consumer\'s slice, "index/count", e.g. "0/2" (the first of two).')

    @field_validator("client_id")
    @classmethod
    def _glob(cls, value: str) -> str:
        if not value:
            raise ValueError('must be a client.id glob, e.g. "etl-1"')
        return value

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_name(value)

    @field_validator("slice")
    @classmethod
    def _slice(cls, value: str) -> str:
        m = _SLICE.fullmatch(value.strip())
        if m is None or not 0 <= int(m[1]) < int(m[2]) <= MAX_SLICES:
            raise ValueError(f'must be "index/count" with 0 <= index < count <= {MAX_SLICES}, e.g. "0/2", '
                             f"got {value!r}")
        return value.strip()


class SharingSettings(Section):
    """Cooperative consumption (seed 004, proxy/policies/sharing/): consumers share a partition by key-hash slice.
    Needs a restart."""

    enabled: bool = Field(default=False, description="Sluice-wide switch.")
    clients: list[str | ClientSelectorSettings] = Field(
        default_factory=lambda: list[str | ClientSelectorSettings](["*"]),
        description="The consumers that opt in (first switch per consumer): client.id globs, or client selectors "
                    "({client_id, principal, client_address}, all given must match).")
    topics: list[SharingTopicSettings] = Field(default_factory=list,
                                               description="The topics that may be shared (per-topic switch).")
    standalone: list[SharingStandaloneSettings] = Field(
        default_factory=list, description="Slices of consumers that use assign() instead of a group.")
    cache_max_bytes: Annotated[int, Field(ge=0)] = Field(
        default=64 * 1024 * 1024,
        description="Decoded batches kept for the other members of the same partition in this Sluice; 0 = none.")
    member_wait_s: Annotated[float, Field(gt=0, le=600)] = Field(
        default=10.0,
        description="How long fetches of an opted-in consumer whose group member Sluice does not know (after a "
                    "Sluice restart) are withheld waiting for it; then they pass unfiltered.")
    metadata_max_bytes: Annotated[int, Field(ge=256, le=1 << 20)] = Field(
        default=4096, description="The brokers' offset.metadata.max.bytes: commit metadata Sluice writes fits it.")

    @field_validator("clients")
    @classmethod
    def _clients(cls, value: list[str | ClientSelectorSettings]) -> list[str | ClientSelectorSettings]:
        if any(isinstance(glob, str) and not glob for glob in value):
            raise ValueError('a client.id glob cannot be empty ("*" = every client)')
        return value

    @field_validator("member_wait_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return _check_finite(value)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        _one_entry_per_topic("sharing", [t.topic for t in self.topics])
        if self.enabled and not any(t.shared for t in self.topics):
            raise KeyedValueError("topics", "sharing is enabled but no topic may be shared: add a "
                                            '[[sharing.topics]] entry, e.g. topic = "orders-*"')
        seen: dict[tuple[str, str], tuple[int, set[int]]] = {}
        counts: dict[str, int] = {}
        for i, e in enumerate(self.standalone):
            parts = set(e.partitions)
            key = (e.client_id, e.topic)
            if key in seen and (not parts or not seen[key][1] or parts & seen[key][1]):
                raise KeyedValueError(f"standalone[{i}]", f"client {e.client_id!r} already has a slice of "
                                                          f"{e.topic!r} there (sharing.standalone[{seen[key][0]}])")
            seen[key] = (i, parts)
            count = int(e.slice.split("/")[1])
            if counts.setdefault(e.topic, count) != count:
                raise KeyedValueError(f"standalone[{i}].slice", f"{e.topic!r} is split in {counts[e.topic]} "
                                                                "slices by another entry: one count per topic")
        return self


# -------------------------------------------------------------------------------------------- settings


class Settings(Section):
    """All of Sluice's settings. One field per TOML section; add a section by adding a field.

    Sections are frozen, so one shared default instance per section is safe.
    """

    upstream: UpstreamSettings = UpstreamSettings()
    listen: ListenSettings = ListenSettings()
    limits: LimitsSettings = LimitsSettings()
    shutdown: ShutdownSettings = ShutdownSettings()
    admin: AdminSettings = AdminSettings()
    logging: LoggingSettings = LoggingSettings()
    size_limit: SizeLimitSettings = SizeLimitSettings()
    throttle: ThrottleSettings = ThrottleSettings()
    sessions: SessionsSettings = SessionsSettings()
    sharing: SharingSettings = SharingSettings()

    @model_validator(mode="after")
    def _cross_section(self) -> Self:
        # A port shared by two listeners would fail at bind time with a less helpful message. (Broker node ids
        # are only known at run time, so only node 0's port, broker_port_base itself, can be checked here.)
        admin, listen = self.admin, self.listen
        if admin.enabled and admin.port and _hosts_overlap(admin.host, listen.host):
            for name, port in (
                ("bootstrap_port", listen.bootstrap_port),
                ("broker_port_base", listen.broker_port_base),
            ):
                if admin.port == port:
                    raise KeyedValueError("admin.port", f"collides with listen.{name} ({port})")
        return self

    def with_overrides(self, overrides: Mapping[str, Any]) -> Settings:
        """A validated copy with dotted keys replaced, e.g. ``{"listen.bootstrap_port": 0}``.

        Raises :class:`ConfigError` like :func:`load_settings`. (``model_copy(update=...)`` also works but
        does not validate, and needs one nested ``model_copy`` per section.)
        """
        data = self.model_dump()
        for dotted, value in overrides.items():
            _set_path(data, dotted.split("."), value)
        return _validate(data, {k: "from override" for k in overrides}, "from override")

    def redacted(self) -> dict[str, Any]:
        """``model_dump()`` with secrets replaced, for logging the effective configuration at start-up."""
        data = self.model_dump()
        if data["admin"]["token"]:
            data["admin"]["token"] = "***"
        if data["upstream"]["sasl"]["password"]:
            data["upstream"]["sasl"]["password"] = "***"
        data["logging"]["access_log_kafka"]["properties"] = self.logging.access_log_kafka.redacted_properties()
        # file paths are not secrets (the files are); nothing else in the TLS sections is
        return data


# --------------------------------------------------------------------------------------------- loading


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Settings:
    """Defaults <- TOML file at ``path`` (None = no file) <- ``env`` overrides (None = ``os.environ``).

    Pass ``env={}`` for settings independent of the process environment (tests).
    Raises :class:`ConfigError` for anything invalid.
    """
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    default_source = ""
    if path is not None:
        name = os.fspath(path)
        default_source = f"in {name}"
        try:
            with open(name, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError("", f"config file not found: {name}") from None
        except OSError as exc:
            raise ConfigError("", f"cannot read config file {name}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("", f"{name} is not valid TOML: {exc}") from None
    for var, raw in sorted((os.environ if env is None else env).items()):
        parsed = _parse_env(var, raw)
        if parsed is not None:
            parts, value = parsed
            _set_path(data, parts, value)
            sources[".".join(parts)] = f"from env {var}"
    return _validate(data, sources, default_source)


def _validate(data: dict[str, Any], sources: Mapping[str, str], default_source: str) -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise _to_config_error(exc, sources, default_source) from None


def _set_path(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is a value in the file, but a section is expected")
        node = child
    node[parts[-1]] = value


# ------------------------------------------------------------------------------------------ state file

#: Settings sections that are changeable while running (admin API, SIGHUP), and so the ones a state file holds.
DYNAMIC_SECTIONS = ("size_limit", "throttle")
STATE_KEY = "admin.state_file"
#: ``"version"`` in the state file: a later Sluice that changes the format can tell an old file from its own.
STATE_VERSION = 1


def read_state(path: str) -> dict[str, Any]:
    """The sections saved in the state file at ``path`` (``{}`` when there is no file yet: nothing was changed
    through the admin API). Raises :class:`ConfigError` naming ``admin.state_file`` if it cannot be read or is
    not a state file; each section's values are validated by :func:`apply_state_file`."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(STATE_KEY, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(STATE_KEY, f"{path} is not valid JSON ({exc}); fix or delete it") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise ConfigError(STATE_KEY, f'{path} is not a Sluice state file (a JSON object with "version": '
                                     f"{STATE_VERSION}); fix or delete it")
    for key, value in data.items():
        if key != "version" and key not in DYNAMIC_SECTIONS:
            raise ConfigError(STATE_KEY, f"{path}: unknown section {key!r} (a state file holds "
                                         f"{', '.join(DYNAMIC_SECTIONS)}); fix or delete it")
        if key != "version" and not isinstance(value, dict):
            raise ConfigError(STATE_KEY, f"{path}: {key!r} is not a JSON object; fix or delete it")
    return {k: v for k, v in data.items() if k != "version"}


def write_state(path: str, sections: Mapping[str, Any]) -> None:
    """Replace the state file at ``path`` with ``sections`` atomically: a reader (or a start-up after a crash or
    power loss) sees the old file or the new one, never a mix or a truncated file. Written to a temporary file in
    the same directory (os.replace is atomic only within one filesystem), fsynced, renamed over ``path``
    (POSIX rename), then the directory is fsynced so the rename itself is durable. The file is readable by its
    owner only (mkstemp's mode 0600). Raises OSError; ``path`` is then unchanged and no temporary file is left
    behind."""
    text = json.dumps({"version": STATE_VERSION, **sections}, indent=2, sort_keys=True) + "\n"
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_state_section(path: str, section: str, values: Mapping[str, Any]) -> None:
    """Save one dynamic section (its whole ``model_dump()``) in the state file, keeping the other sections saved
    there. Raises :class:`ConfigError` naming ``admin.state_file`` if the file cannot be read or written."""
    sections = read_state(path)
    sections[section] = dict(values)
    try:
        write_state(path, sections)
    except OSError as exc:
        raise ConfigError(STATE_KEY, f"cannot write {path}: {exc.strerror or exc}") from None


def apply_state_file(settings: Settings, path: str | None = None) -> Settings:
    """``settings`` with the sections saved in the state file (``path``, default ``settings.admin.state_file``;
    empty = none) replacing theirs whole: the last admin API change wins over the config file, the environment
    and the defaults. Used at start-up (``sluice run``) and by every SIGHUP reload, so a restart and a reload give
    the same configuration. Raises :class:`ConfigError` naming ``admin.state_file`` if the file is unreadable, not
    a state file, holds an invalid value, or its directory is missing or not writable (admin changes could not
    be saved: better refused at start-up than at the first PUT)."""
    path = settings.admin.state_file if path is None else path
    if not path:
        return settings
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(STATE_KEY, f"directory {directory} of {path} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(STATE_KEY, f"cannot write in {directory}, the directory of {path}")
    sections = read_state(path)
    if not sections:
        return settings
    try:
        return settings.with_overrides(sections)
    except ConfigError as exc:
        raise ConfigError(STATE_KEY, f"{path}: {exc.key}: {exc.reason}; fix or delete it") from None


# ------------------------------------------------------------------------------------------ env values


def _parse_env(var: str, raw: str) -> tuple[list[str], Any] | None:
    """``SLUICE_A__B=raw`` -> (["a", "b"], typed value); None if ``var`` is not an override variable."""
    if not var.upper().startswith(ENV_PREFIX) or ENV_SEPARATOR not in var:
        return None
    parts = [p.lower() for p in var[len(ENV_PREFIX) :].split(ENV_SEPARATOR)]
    source = f"from env {var}"
    model: type[BaseModel] = Settings
    for i, part in enumerate(parts):
        dotted = ".".join(parts[: i + 1])
        field = model.model_fields.get(part)
        if field is None:
            raise ConfigError(dotted, _unknown_key_reason(part, model), source)
        ann = _unwrap(field.annotation)
        if i < len(parts) - 1:
            if not _is_model(ann):
                raise ConfigError(dotted, "is a key, not a section", source)
            model = typing.cast(type[BaseModel], ann)
        elif _is_model(ann):
            raise ConfigError(dotted, f"is a section; set its keys as {var}__<KEY>", source)
        else:
            return parts, _coerce_env(ann, raw, dotted, source)
    return None  # pragma: no cover - the loop always returns or raises


def _coerce_env(ann: Any, raw: str, key: str, source: str) -> Any:
    """Turn an env string into the field's Python type; constraints are then checked by the model."""
    origin = typing.get_origin(ann)
    if origin is list:
        (item,) = typing.get_args(ann)
        return [_coerce_env(_unwrap(item), s.strip(), key, source) for s in raw.split(",") if s.strip()]
    if ann is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(key, f"expected true/false, got {raw!r}", source)
    if ann is int:
        try:
            return int(raw.strip())
        except ValueError:
            raise ConfigError(key, f"expected an integer, got {raw!r}", source) from None
    if ann is float:
        try:
            return float(raw.strip())
        except ValueError:
            raise ConfigError(key, f"expected a number, got {raw!r}", source) from None
    if ann is str or origin is Literal:
        return raw
    raise ConfigError(key, "cannot be set from the environment; set it in the config file", source)


def _unwrap(ann: Any) -> Any:
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    return ann


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


# ------------------------------------------------------------------------------------------ error text


def _unknown_key_reason(key: str, model: type[BaseModel] | None) -> str:
    if model is None:
        return "unknown key"
    known = list(model.model_fields)
    what = "section" if model is Settings else "key"
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"unknown {what} ({hint})"


def _walk(loc: tuple[int | str, ...]) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """Follow ``loc`` from Settings: (the model at ``loc``, or None if it is not a model; the last field)."""
    model: type[BaseModel] | None = Settings
    field: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int):
            continue  # list index: the element type was already taken below
        if model is None or (field := model.model_fields.get(part)) is None:
            return None, None
        ann = _unwrap(field.annotation)
        if typing.get_origin(ann) is list:
            ann = _unwrap(typing.get_args(ann)[0])
        model = typing.cast(type[BaseModel], ann) if _is_model(ann) else None
    return model, field


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _to_config_error(exc: ValidationError, sources: Mapping[str, str], default_source: str) -> ConfigError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    err = first.get("ctx", {}).get("error")
    if isinstance(err, KeyedValueError):
        key = ".".join([_dotted(loc), err.key]) if loc else err.key
        reason = err.reason
    else:
        key = _dotted(loc)
        if first["type"] == "extra_forbidden":
            model, _ = _walk(loc[:-1])
            reason = _unknown_key_reason(str(loc[-1]), model)
        else:
            msg = first["msg"].removeprefix("Value error, ")
            reason = msg[:1].lower() + msg[1:]
            _, field = _walk(loc)
            value = first.get("input")
            # Echo the offending value unless it is a secret (repr=False) or a whole section/list.
            secret = field is not None and field.repr is False
            if not secret and not isinstance(value, dict | list) and first["type"] != "value_error":
                text = repr(value)
                reason += f", got {text if len(text) <= 80 else text[:77] + '...'}"
    if len(errors) > 1:
        reason += f" (+{len(errors) - 1} more)"
    # Most specific source first: the key itself, then its section, then the file.
    base_key = key.split("[", 1)[0]
    source = sources.get(base_key) or sources.get(base_key.rsplit(".", 1)[0]) or default_source
    return ConfigError(key, reason, source)
