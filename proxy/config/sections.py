"""Sluice's core settings sections: where clients connect and where the cluster is, limits, shutdown, the admin
server, logging. Policies bring their own sections (``proxy/policies/<name>/settings.py``); the loader composes
both into :class:`~proxy.config.loader.Settings`.

Models are strict (a TOML string ``"19092"`` is not a port) and forbid unknown keys, so a misspelt key fails
loudly instead of silently keeping its default. They are frozen: code that needs other settings makes a copy.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, ClassVar, Literal

from .base import (
    FilePath,
    FrameBytes,
    HostPort,
    KeyedValueError,
    Meta,
    OneOf,
    Port,
    Seconds,
    Section,
    check_finite,
    check_host,
    check_pair,
    check_topic_name,
    field,
    field_validator,
    model_validator,
    parse_host_port,
)

TlsVersion = Literal["TLSv1.2", "TLSv1.3"]


class ServerTlsSettings(Section, kw_only=True, frozen=True):
    """``[listen.tls]``: TLS on the client-facing listeners (bootstrap and every broker port). The files are
    re-read when they change (checked every ``reload_interval_s``) and on SIGHUP: new connections get the new
    certificate, open ones keep theirs. Needs a restart to turn on or off."""

    enabled: Annotated[bool, Meta(description="Clients connect with TLS (security.protocol SSL or SASL_SSL).")] = False
    cert_file: Annotated[FilePath, Meta(description="PEM certificate chain the listeners present (leaf first).")] = ""
    key_file: Annotated[FilePath, Meta(description="PEM private key of cert_file (unencrypted, or see "
                                                   "key_password_file).")] = ""
    key_password_file: Annotated[FilePath, Meta(description="File holding the key's password (empty = the key "
                                                            "is not encrypted).")] = ""
    ca_file: Annotated[FilePath, Meta(description="PEM CA bundle client certificates must chain to (mTLS); "
                                                  "needed when client_auth is not none.")] = ""
    client_auth: Annotated[Literal["none", "requested", "required"], Meta(
        description="Client certificates (Kafka's ssl.client.auth): none, requested (verified "
                    "when sent), required (mTLS: a client without one is refused).")] = "none"
    min_version: Annotated[TlsVersion, Meta(description="Lowest TLS version accepted.")] = "TLSv1.2"
    max_version: Annotated[TlsVersion, Meta(description="Highest TLS version accepted.")] = "TLSv1.3"
    reload_interval_s: Annotated[float, Meta(
        ge=0, le=86_400,
        description="How often the certificate files are checked for changes; 0 = only on SIGHUP.")] = 30.0

    @model_validator
    def _complete(self) -> None:
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


class ListenerSettings(Section, kw_only=True, frozen=True):
    """One ``[[listen.listeners]]`` entry: settings of the listeners whose name matches ``listener`` (first match
    wins), over ``[listen]``/``[listen.tls]``'s."""

    listener: Annotated[str, Meta(description='Listener name or glob: "bootstrap", "broker-3", "broker-*".')]
    proxy_protocol: Annotated[Literal["off", "v1", "v2", "any"] | None, Meta(
        description="PROXY protocol on these listeners (default: listen.proxy_protocol).")] = None
    cert_file: Annotated[FilePath, Meta(description="Certificate these listeners present instead of "
                                                    "listen.tls.cert_file (with key_file).")] = ""
    key_file: Annotated[FilePath, Meta(description="Private key of cert_file.")] = ""

    @field_validator("listener")
    @classmethod
    def _listener(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9*?\[\]!-]+", value):
            raise ValueError('must be "bootstrap", "broker-N" or a glob of them, e.g. "broker-*"')
        return value

    @model_validator
    def _pair(self) -> None:
        check_pair(self.cert_file, self.key_file)


class ClientTlsSettings(Section, kw_only=True, frozen=True):
    """``[upstream.tls]``: TLS from Sluice to the brokers (also for Sluice's own Metadata lookups)."""

    enabled: Annotated[bool, Meta(description="Connect to the brokers with TLS (their SSL / SASL_SSL "
                                              "listener).")] = False
    ca_file: Annotated[FilePath, Meta(description="PEM CA bundle the brokers' certificates must chain to "
                                                  "(empty = the system's CAs).")] = ""
    check_hostname: Annotated[bool, Meta(description="Verify that a broker's certificate names the host "
                                                     "Sluice connects to (Kafka's "
                                                     "ssl.endpoint.identification.algorithm=https).")] = True
    cert_file: Annotated[FilePath, Meta(description="Client certificate Sluice presents (brokers with "
                                                    "ssl.client.auth), with key_file.")] = ""
    key_file: Annotated[FilePath, Meta(description="Private key of cert_file.")] = ""
    key_password_file: Annotated[FilePath, Meta(description="File holding the key's password.")] = ""
    min_version: Annotated[TlsVersion, Meta(description="Lowest TLS version Sluice offers.")] = "TLSv1.2"

    @model_validator
    def _pair(self) -> None:
        check_pair(self.cert_file, self.key_file)


class UpstreamSaslSettings(Section, kw_only=True, frozen=True):
    """``[upstream.sasl]``: Sluice's own SASL identity for the requests it makes itself (Metadata lookups of the
    brokers and of topic names) when the brokers' listener requires SASL. Clients' credentials are never used:
    they are relayed untouched."""

    secret_fields: ClassVar[frozenset[str]] = frozenset({"password"})

    mechanism: Annotated[Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], Meta(
        description='Mechanism of Sluice\'s own authentication; "" = none.')] = ""
    username: Annotated[str, Meta(description="Sluice's user.")] = ""
    # a secret field (secret_fields): never in a repr or a ConfigError message
    password: Annotated[str, Meta(description="Its password (set it through "
                                              "SLUICE_UPSTREAM__SASL__PASSWORD, or password_file).")] = ""
    password_file: Annotated[FilePath, Meta(description="File holding the password; exclusive with password.")] = ""

    @model_validator
    def _complete(self) -> None:
        if self.password and self.password_file:
            raise KeyedValueError("password_file", "set either password or password_file, not both")
        if self.mechanism and not self.username:
            raise KeyedValueError("username", f"is needed with mechanism = {self.mechanism!r}")
        if self.mechanism and not (self.password or self.password_file):
            raise KeyedValueError("password", f"is needed with mechanism = {self.mechanism!r} (or password_file)")

    def secret(self) -> str:
        """The password in force (read from password_file now, if that is where it is)."""
        if not self.password_file:
            return self.password
        with open(self.password_file, encoding="utf-8") as fh:
            return fh.read().strip()


class UpstreamSettings(Section, kw_only=True, frozen=True):
    """Where the real Kafka cluster is."""

    bootstrap_servers: Annotated[list[HostPort], Meta(
        description="Upstream bootstrap brokers, host:port; the rest of the cluster is learnt from Metadata.",
    )] = field(default_factory=lambda: ["127.0.0.1:9092"])
    connect_timeout_s: Annotated[Seconds, Meta(description="TCP connect timeout to an upstream broker.")] = 10.0
    tls: Annotated[ClientTlsSettings, Meta(
        description="TLS to the brokers (off by default).")] = field(default_factory=ClientTlsSettings)
    sasl: Annotated[UpstreamSaslSettings, Meta(
        description="Sluice's own SASL identity for its lookups (off by default).",
    )] = field(default_factory=UpstreamSaslSettings)

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one host:port")
        return value

    @field_validator("connect_timeout_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``bootstrap_servers`` parsed into ``(host, port)`` pairs."""
        return [parse_host_port(s) for s in self.bootstrap_servers]


class ListenSettings(Section, kw_only=True, frozen=True):
    """Where clients connect. Changing these needs a restart."""

    host: Annotated[str, Meta(description="Address the bootstrap and broker listeners bind.")] = "127.0.0.1"
    bootstrap_port: Annotated[Port, Meta(description="Port clients bootstrap from.")] = 19092
    broker_port_base: Annotated[Port, Meta(
        description="Upstream broker node N is served on broker_port_base + N; 0 = free port per node.")] = 19093
    advertised_host: Annotated[str, Meta(
        description="Host clients are told in Metadata/FindCoordinator/DescribeCluster.")] = "127.0.0.1"
    proxy_protocol: Annotated[Literal["off", "v1", "v2", "any"], Meta(
        description="Read a PROXY protocol header (HAProxy's v1 / v2 / either) at the start of "
                    "every client connection: behind a load balancer the real client address is "
                    "then the one logged, selected on and limited. A connection without one is "
                    "closed.")] = "off"
    tls: Annotated[ServerTlsSettings, Meta(
        description="TLS for clients (off by default).")] = field(default_factory=ServerTlsSettings)
    listeners: Annotated[list[ListenerSettings], Meta(
        description="Per-listener settings, first match wins.")] = field(default_factory=list)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_host(value)

    @field_validator("advertised_host")
    @classmethod
    def _advertised(cls, value: str) -> str:
        check_host(value)
        # Clients would try to connect to the wildcard address itself; this is the classic
        # advertised.listeners mistake, so refuse it here rather than let clients fail later.
        if value in ("0.0.0.0", "::", "[::]"):
            raise ValueError("must be an address clients can connect to, not a wildcard bind address")
        return value

    @model_validator
    def _base(self) -> None:
        value, bootstrap = self.broker_port_base, self.bootstrap_port
        # base + node id must never land on the bootstrap port; node ids are only known at run time, so the
        # one rule that is always safe is "bootstrap below the broker range".
        if value and bootstrap and bootstrap >= value:
            raise KeyedValueError(
                "broker_port_base", f"must be above listen.bootstrap_port ({bootstrap}): broker node N listens on "
                                    "base+N and must not collide with the bootstrap port")


class LimitsSettings(Section, kw_only=True, frozen=True):
    """Memory and frame bounds (the proxy never buffers without bound)."""

    max_frame_bytes: Annotated[FrameBytes, Meta(
        description="Largest frame accepted from either side (broker: socket.request.max.bytes).")] = 104857600
    write_high_water_bytes: Annotated[int, Meta(
        gt=0, description="Pause reading the other side when a write buffer grows past this.")] = 4194304
    write_low_water_bytes: Annotated[int, Meta(
        ge=0, description="Resume reading once the write buffer has drained below this.")] = 1048576
    request_timeout_s: Annotated[float, Meta(
        gt=0, le=3600, description="Close a client connection whose request frame stays incomplete this long after "
                                   "its first "
                                   "byte (Kafka clients' request.timeout.ms default: 30 s).")] = 30.0

    max_connections: Annotated[int, Meta(
        ge=0, description="Client connections open at once; more are closed at accept (Kafka's "
                          "max.connections). 0 = no bound.")] = 0
    max_connections_per_address: Annotated[int, Meta(
        ge=0, description="Client connections open at once from one client address (Kafka's "
                          "max.connections.per.ip). 0 = no bound.")] = 0
    max_inflight_requests: Annotated[int, Meta(
        ge=0, description="Requests a connection may have owed a response; then it is not read until one "
                          "goes out (Kafka's channel muting, queued.max.requests). 0 = no bound.")] = 0
    idle_timeout_s: Annotated[float, Meta(
        ge=0, le=86_400, description="Close a client connection with nothing in flight and no bytes from the client "
                                     "for this long (Kafka's connections.max.idle.ms, 10 min). 0 = never.")] = 600.0

    @model_validator
    def _low_below_high(self) -> None:
        value, high = self.write_low_water_bytes, self.write_high_water_bytes
        if value >= high:
            raise KeyedValueError("write_low_water_bytes", f"must be below limits.write_high_water_bytes ({high})")


class ShutdownSettings(Section, kw_only=True, frozen=True):
    """Graceful shutdown."""

    drain_timeout_s: Annotated[float, Meta(
        ge=0, description="On SIGTERM, how long in-flight requests may take before connections are closed.")] = 10.0

    @field_validator("drain_timeout_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)


class AdminPrincipalSettings(Section, kw_only=True, frozen=True):
    """``[[admin.principals]]``: one operator of the admin API, known by a bearer token of their own."""

    name: Annotated[str, Meta(
        description="Who: the name a fleet's history records for the changes made with this token.")]
    token_file: Annotated[FilePath, Meta(
        description="File holding this principal's bearer token (e.g. a mounted secret).")]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or value != value.strip() or len(value) > 200:
            raise ValueError("must be a name of 1 to 200 characters without surrounding spaces")
        return value

    @model_validator
    def _token(self) -> None:
        read_token_file(self.token_file)


class AdminSettings(Section, kw_only=True, frozen=True):
    """The admin HTTP server (/metrics, /healthz, /readyz, and the endpoints of the run-time changeable sections)."""

    secret_fields: ClassVar[frozenset[str]] = frozenset({"token"})

    enabled: Annotated[bool, Meta(description="Serve the admin HTTP endpoints.")] = True
    host: Annotated[str, Meta(description="Admin bind address.")] = "127.0.0.1"
    port: Annotated[Port, Meta(description="Admin port; 0 = a free port.")] = 9644
    # a secret field (secret_fields): kept out of reprs and ConfigError messages
    token: Annotated[str, Meta(description="Bearer token for mutating endpoints (set it from the environment, "
                                           "SLUICE_ADMIN__TOKEN, or use token_file); empty = no check.")] = ""
    token_file: Annotated[FilePath, Meta(description="File holding the bearer token (e.g. a mounted secret); "
                                                     "exclusive with token.")] = ""
    auth_reads: Annotated[bool, Meta(description="Require the token for GET endpoints too (/healthz and "
                                                 "/readyz stay open for probes).")] = False
    tls_cert_file: Annotated[FilePath, Meta(description="Serve the admin API over HTTPS with this PEM "
                                                        "certificate (with tls_key_file).")] = ""
    tls_key_file: Annotated[FilePath, Meta(description="Private key of tls_cert_file.")] = ""
    client_ca_file: Annotated[FilePath, Meta(description="With tls_cert_file: client certificates signed by "
                                                         "this CA are required (mTLS); the principal is the "
                                                         "certificate's subject CN.")] = ""
    principals: Annotated[list[AdminPrincipalSettings], Meta(
        description="Operators known by a bearer token of their own ({name, token_file}); "
                    "the token of `token`/`token_file` is the principal \"admin\".")] = field(default_factory=list)
    state_file: Annotated[str, Meta(
        description="File where admin API changes to the run-time changeable sections are saved (atomically) "
                    "and re-applied over the config file at start-up and on SIGHUP; empty = not saved.")] = ""

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_host(value)

    @field_validator("token")
    @classmethod
    def _token(cls, value: str) -> str:
        # A token with spaces could never be sent in an "Authorization: Bearer <token>" header.
        if value != value.strip() or any(c.isspace() for c in value):
            raise ValueError("must not contain whitespace")
        return value

    @model_validator
    def _token_source(self) -> None:
        if self.token and self.token_file:
            raise KeyedValueError("token_file", "set either token or token_file, not both")
        if self.token_file:
            read_token_file(self.token_file)
        check_pair(self.tls_cert_file, self.tls_key_file, "tls_")
        if self.client_ca_file and not self.tls_cert_file:
            raise KeyedValueError("client_ca_file", "needs tls_cert_file and tls_key_file (mTLS is TLS)")
        names = [p.name for p in self.principals]
        if len(set(names)) != len(names):
            raise KeyedValueError("principals", "each principal's name once")

    def bearer_token(self) -> str:
        """The token in force: ``token``, or the contents of ``token_file`` (read now)."""
        return read_token_file(self.token_file) if self.token_file else self.token

    def tokens(self) -> dict[str, str]:
        """Every bearer token in force -> its principal (files read now): ``principals``' and ``token``'s
        ("admin")."""
        out = {read_token_file(p.token_file): p.name for p in self.principals}
        if token := self.bearer_token():
            out[token] = "admin"
        return out

    @property
    def authenticates(self) -> bool:
        """Whether the admin API knows who calls it (a token, a principal or client certificates)."""
        return bool(self.token or self.token_file or self.principals or self.client_ca_file)

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


LogLevel = Annotated[str, OneOf("debug", "info", "warning", "error")]

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



class AccessLogKafkaSettings(Section, kw_only=True, frozen=True):
    """``[logging.access_log_kafka]``: the access log also produced to a Kafka topic (the same JSON line per request,
    the same schema), from a bounded buffer that never blocks the proxy: when the buffer is full the event is
    dropped and counted (``sluice_access_log_dropped_total``). Needs a restart."""

    enabled: Annotated[bool, Meta(description="Produce every access-log event to `topic`.")] = False
    bootstrap_servers: Annotated[list[HostPort], Meta(
        description="The cluster the events go to, host:port; empty = the upstream cluster "
                    "(upstream.bootstrap_servers).")] = field(default_factory=list)
    topic: Annotated[str, Meta(description="Topic the events are produced to.")] = "sluice-access-log"
    key: Annotated[str, Meta(
        description="Message key of every event: names this Sluice process in the analytics (its `source`, as the "
                    "file name does for files) and keeps its events in one partition, in order; empty = "
                    '"<hostname>:<pid>".')] = ""
    buffer_events: Annotated[int, Meta(
        ge=1, le=10_000_000, description="Events held while the cluster is slow or down; beyond it events are "
                                         "dropped.")] = 100_000
    buffer_bytes: Annotated[int, Meta(
        ge=1024, le=2**31 - 1, description="Bytes held (the same buffer, bounded in bytes too); beyond it events "
                                           "are dropped.")] = 67_108_864
    linger_ms: Annotated[int, Meta(
        ge=0, le=60_000, description="How long events wait to be batched before they are sent.")] = 100
    compression: Annotated[Literal["none", "gzip", "snappy", "lz4", "zstd"], Meta(
        description="Batch compression (JSON lines compress about 10x).")] = "lz4"
    delivery_timeout_s: Annotated[float, Meta(
        gt=0, le=86_400, description="An event the cluster has not taken this long after it was buffered is "
                                     "dropped (counted as delivery_failed).")] = 120.0
    flush_timeout_s: Annotated[float, Meta(
        ge=0, le=3600, description="At shutdown, how long buffered events may take to be sent; the rest are "
                                   "dropped (counted as stopped).")] = 5.0
    properties: Annotated[dict[str, str], Meta(
        description="Further librdkafka producer properties, e.g. security.protocol, sasl.mechanism, "
                    "sasl.username, sasl.password, ssl.ca.location (checked when Sluice starts).",
    )] = field(default_factory=dict)

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
        return check_finite(value)

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


class LoggingSettings(Section, kw_only=True, frozen=True):
    """Operational log (stderr) and access log."""

    level: Annotated[LogLevel, Meta(description="Operational log level.")] = "info"
    access_log: Annotated[str, Meta(description='Access log destination: "-" stdout, "off", or a file path.')] = "-"
    format: Annotated[str, OneOf("json", "console"), Meta(description="Operational log format.")] = "json"
    access_log_kafka: Annotated[AccessLogKafkaSettings, Meta(
        description="The access log also produced to a Kafka topic (off by default).",
    )] = field(default_factory=AccessLogKafkaSettings)

    @field_validator("access_log")
    @classmethod
    def _access_log(cls, value: str) -> str:
        if not value.strip():
            raise ValueError('must be "-" (stdout), "off", or a file path')
        return value


_FLEET_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


class FleetSettings(Section, kw_only=True, frozen=True):
    """``[fleet]``: this Sluice is one instance of a fleet whose run-time changeable sections are kept in a Kafka
    topic (proxy/fleet/): every instance applies each change of the control topic, and the admin API's PUTs write
    there. Off by default (a single instance keeps its state file). Needs a restart."""

    enabled: Annotated[bool, Meta(description="Take the dynamic sections from the fleet's control topic.")] = False
    name: Annotated[str, Meta(description="The fleet's name (letters, digits, '.', '_', '-'); every instance "
                                          "of one fleet has the same.")] = ""
    control_topic: Annotated[str, Meta(description='Compacted topic of the fleet\'s settings; empty = '
                                                   '"sluice-fleet-<name>".')] = ""
    status_topic: Annotated[str, Meta(description='Topic of the instances\' status records; empty = '
                                                  '"sluice-fleet-<name>-status".')] = ""
    history_topic: Annotated[str, Meta(description='Topic of every change made, not compacted; empty = '
                                                   '"sluice-fleet-<name>-history".')] = ""
    instance_id: Annotated[str, Meta(description='This instance\'s id in the status topic; empty = '
                                                 '"<hostname>:<bootstrap port>".')] = ""
    bootstrap_servers: Annotated[list[HostPort], Meta(
        description="The control cluster, host:port; empty = the upstream cluster.")] = field(default_factory=list)
    credentials: Annotated[Literal["upstream", "fleet"], Meta(
        description='TLS and SASL to the control cluster: "upstream" = [upstream.tls] and '
                    '[upstream.sasl]; "fleet" = [fleet.tls] and [fleet.sasl].')] = "upstream"
    tls: Annotated[ClientTlsSettings, Meta(
        description='TLS to the control cluster (with credentials = "fleet").',
    )] = field(default_factory=ClientTlsSettings)
    sasl: Annotated[UpstreamSaslSettings, Meta(
        description='SASL to the control cluster (with credentials = "fleet").',
    )] = field(default_factory=UpstreamSaslSettings)
    startup_timeout_s: Annotated[float, Meta(
        gt=0, le=3600, description="At start-up, how long to wait for the control topic before on_unreachable "
                                   "applies.")] = 30.0
    on_unreachable: Annotated[Literal["serve-local", "wait"], Meta(
        description='The control topic not read within startup_timeout_s: "serve-local" '
                    'serves with the local settings (the fleet\'s applied when it answers); '
                    '"wait" opens no listener and keeps /readyz not ready until it was read.')] = "serve-local"
    write_timeout_s: Annotated[float, Meta(
        gt=0, le=600, description="How long an admin change may take to be written to the control topic.")] = 15.0
    status_interval_s: Annotated[float, Meta(
        gt=0, le=3600, description="How often this instance publishes its status record.")] = 5.0
    forget_silent_after_s: Annotated[float, Meta(
        gt=0, description="`sluice fleet status` leaves out instances silent for longer than this.")] = 86400.0
    replication_factor: Annotated[int, Meta(
        ge=0, le=32, description="Replication factor of the topics Sluice creates; 0 = min(3, brokers).")] = 0
    usage_topic: Annotated[str, Meta(description='Topic of the instances\' quota usage reports (fleet-scoped '
                                                 '[quota] entries); empty = "sluice-fleet-<name>-usage".')] = ""
    usage_interval_s: Annotated[float, Meta(
        gt=0, le=60, description="How often this instance publishes its quota usage (and its shares follow).")] = 1.0

    @field_validator("name", "instance_id")
    @classmethod
    def _name(cls, value: str) -> str:
        if value and not _FLEET_NAME.fullmatch(value.replace(":", "_")):
            raise ValueError("only letters, digits, '.', '_', '-' (':' in instance_id), at most 100")
        return value

    @field_validator("control_topic", "status_topic", "history_topic", "usage_topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_name(value) if value else value

    @field_validator("startup_timeout_s", "write_timeout_s", "status_interval_s", "forget_silent_after_s",
                     "usage_interval_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        return check_finite(value)

    @model_validator
    def _complete(self) -> None:
        if self.enabled and not self.name:
            raise KeyedValueError("name", "is needed when the fleet is enabled")
        if len({self.control, self.status, self.history, self.usage}) < 4:
            raise KeyedValueError(
                "usage_topic" if self.usage in (self.control, self.status, self.history) else
                "history_topic" if self.history in (self.control, self.status) else "status_topic",
                "control, status, history and usage topics must differ")

    @property
    def control(self) -> str:
        """The control topic in force."""
        return self.control_topic or f"sluice-fleet-{self.name}"

    @property
    def status(self) -> str:
        """The status topic in force."""
        return self.status_topic or f"sluice-fleet-{self.name}-status"

    @property
    def history(self) -> str:
        """The history topic in force."""
        return self.history_topic or f"sluice-fleet-{self.name}-history"

    @property
    def usage(self) -> str:
        """The quota usage topic in force."""
        return self.usage_topic or f"sluice-fleet-{self.name}-usage"

    @property
    def transactional_id(self) -> str:
        """The fleet's writers' one transactional id (and its consumers' group id)."""
        return f"sluice-fleet-{self.name}"
