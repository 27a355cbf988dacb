"""The vocabulary of Sluice's settings models: what the core sections (proxy/config/sections.py) and every
policy's own section (``proxy/policies/<name>/settings.py``) are built from.

- :class:`Section`, the base of every settings model: strict types, unknown keys rejected, immutable;
- :class:`ConfigError`, the one error an invalid setting becomes (one line naming the key, exit code 2), and
  :class:`KeyedValueError`, raised by a model's own checks to name the key to change;
- the value checks sections share: host:port, finite numbers, readable files, networks, topic names and globs,
  one entry per topic; and :class:`ClientSelectorSettings` (which clients a rule applies to).

Nothing here knows which sections exist: the loader (:mod:`proxy.config.loader`) composes those.
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator


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


def check_host(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be a non-empty host name or address without spaces")
    return value


def hosts_overlap(a: str, b: str) -> bool:
    wildcards = ("0.0.0.0", "::", "")
    return a == b or a in wildcards or b in wildcards


def check_finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def check_host_port(value: str) -> str:
    parse_host_port(value)
    return value.strip()  # stored normalised, so later code can rely on parse_host_port(s) round-tripping


# An element type (not a list validator) so errors name the entry: upstream.bootstrap_servers[1].
HostPort = Annotated[str, AfterValidator(check_host_port)]
# 0 means "let the OS pick a free port" (tests, and several proxies on one host).
Port = Annotated[int, Field(ge=0, le=65535)]
Seconds = Annotated[float, Field(gt=0)]
# Kafka frames carry an int32 length, so nothing larger can ever be valid.
FrameBytes = Annotated[int, Field(gt=0, le=2**31 - 1)]


# -------------------------------------------------------------------------------------------- sections


class Section(BaseModel):
    """Base of every settings model: strict types, unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=True)



def check_file(value: str) -> str:
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


FilePath = Annotated[str, AfterValidator(check_file)]


def check_pair(cert_file: str, key_file: str, prefix: str = "") -> None:
    """A certificate and its key are given together or not at all."""
    if bool(cert_file) != bool(key_file):
        raise KeyedValueError(f"{prefix}key_file" if cert_file else f"{prefix}cert_file",
                              f"{prefix}cert_file and {prefix}key_file go together")


def check_network(value: str | None) -> str | None:
    if value is None:
        return value
    import ipaddress

    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"must be an IP address or a CIDR network (e.g. 10.1.0.0/16), got {value!r}") from None
    return value


Network = Annotated[str | None, AfterValidator(check_network)]


def check_topic_name(text: str) -> str:
    """A Kafka topic name (Topic.java's rules), not a glob."""
    if topic_is_glob(text):
        raise ValueError(f"{text!r} is a glob; a topic name is needed here")
    return check_topic_or_glob(text)


# Kafka's rules for topic names (clients/.../common/internals/Topic.java, validate()): LEGAL_CHARS
# "[a-zA-Z0-9._-]", at most MAX_NAME_LENGTH = 249 characters, not empty, and neither "." nor "..".
TOPIC_MAX_LENGTH = 249
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_LEGAL = "only ASCII letters, digits, '.', '_' and '-' occur in topic names"
# fnmatch's syntax. None of these can occur in a topic name, so an entry is a glob exactly when it has one.
_GLOB_CHARS = "*?["


def topic_is_glob(text: str) -> bool:
    """Whether a topic entry's topic is a glob (has ``*``, ``?`` or ``[``) rather than a topic name."""
    return any(c in _GLOB_CHARS for c in text)


def check_topic_or_glob(text: str) -> str:
    """A topic entry's topic: a Kafka topic name (Topic.java's rules) or an fnmatch glob that can match
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


def one_entry_per_topic(section: str, topics: list[str], hint: str = "") -> None:
    """Two entries with the same topic (or glob) would leave one silently unused: an exact name and the first
    matching glob each pick one entry, entries are never merged (policies/topic_rules.py, TopicRules)."""
    first: dict[str, int] = {}
    for i, topic in enumerate(topics):
        if topic in first:
            raise KeyedValueError(f"topics[{i}].topic", f"{topic!r} is already {section}.topics[{first[topic]}]: one "
                                                        f"entry per topic name or glob{hint}")
        first[topic] = i


class ClientSelectorSettings(Section):
    """A client selector (proxy/core/selectors.py), e.g. one entry of a policy's list of consumers: consumers
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
