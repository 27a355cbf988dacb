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
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Self, TypeVar

import msgspec
from msgspec import Meta, field
from msgspec.structs import force_setattr

__all__ = [
    "AfterValidator",
    "ConfigError",
    "KeyedValueError",
    "Meta",
    "OneOf",
    "Section",
    "field",
    "field_validator",
    "model_validator",
]


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

    A model validator's error is reported at the model's location (the whole section); carrying the key in the
    exception lets :class:`ConfigError` still name the field the operator should change.
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason


class AfterValidator:
    """A check of one value, in ``Annotated[T, AfterValidator(check)]``: ``check(value)`` returns the value to keep
    (normalised) or raises ValueError. Run after the type and its :class:`~msgspec.Meta` constraints hold, also on
    list elements (so an error names the entry: ``upstream.bootstrap_servers[1]``) and on defaults."""

    __slots__ = ("check",)

    def __init__(self, check: Callable[[Any], Any]) -> None:
        self.check = check


class OneOf(AfterValidator):
    """A name out of ``choices``, given in any case (``"DEBUG"`` is ``"debug"``): ``Annotated[str, OneOf(...)]``."""

    __slots__ = ("choices",)

    def __init__(self, *choices: str) -> None:
        super().__init__(self._one)
        self.choices = choices

    def _one(self, value: str) -> str:
        if value.lower() not in self.choices:
            raise ValueError(f"{one_of(self.choices)}, got {value!r}")
        return value.lower()


def one_of(choices: typing.Sequence[object]) -> str:
    """What a value out of ``choices`` must be, as a config error says it: "must be 'a', 'b' or 'c'"."""
    names = [repr(c) for c in choices]
    return f"must be {', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else f"must be {names[0]}"


def unwrap(ann: Any) -> Any:
    """A field's type without its ``Annotated`` layers (the Meta constraints and checks they carry)."""
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    return ann


_F = TypeVar("_F")


def field_validator(*names: str) -> Callable[[_F], _F]:
    """Decorates a classmethod ``(cls, value) -> value`` of a :class:`Section` checking (and possibly normalising)
    the fields ``names``, in the field's order, after their own types and :class:`AfterValidator` checks."""
    def mark(method: _F) -> _F:
        setattr(getattr(method, "__func__", method), "__sluice_fields__", names)  # noqa: B010 (a function's)
        return method
    return mark


def model_validator(method: _F) -> _F:
    """Decorates a method ``(self) -> None`` of a :class:`Section` checking fields together, once every field
    holds; it raises :class:`KeyedValueError` to name the key to change."""
    method.__sluice_model__ = True  # type: ignore[attr-defined]
    return method


class _Checks:
    """What :meth:`Section.__post_init__` runs for one class: each field's annotation checks and validators, then
    the model validators (computed once per class)."""

    def __init__(self, cls: type[Section]) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        by_field: dict[str, list[Callable[[Any], Any]]] = {}
        models: list[Callable[[Any], Any]] = []
        for klass in reversed(cls.__mro__):
            for attr in vars(klass).values():
                func = getattr(attr, "__func__", attr)
                for name in getattr(func, "__sluice_fields__", ()):
                    by_field.setdefault(name, []).append(attr.__get__(None, cls))
                if getattr(func, "__sluice_model__", False):
                    models.append(func)
        self.fields = [(name, hints[name], by_field.get(name, [])) for name in cls.__struct_fields__]
        self.models = models


_CHECKS: dict[type, _Checks] = {}


def _checks_of(cls: type[Section]) -> _Checks:
    """``cls``'s checks, computed on its first use."""
    checks = _CHECKS.get(cls)
    if checks is None:
        checks = _CHECKS[cls] = _Checks(cls)
    return checks
#: the message of the ValueError a check raises in __post_init__, the key relative to the section (msgspec then
#: appends " - at `$.<path>`", the section's path)
_KEYED = "{key}: {reason}"
_KEYED_RE = re.compile(r"([\w.\[\]]*): (.*)", re.DOTALL)


def _check_value(ann: Any, value: Any) -> Any:
    """``value`` after the :class:`AfterValidator` checks ``ann`` carries (in list elements too); KeyedValueError
    names the element (``[1]``) when it is one."""
    origin = typing.get_origin(ann)
    if origin is Annotated:
        inner, *extras = typing.get_args(ann)
        value = _check_value(inner, value)
        for extra in extras:
            if isinstance(extra, AfterValidator):
                value = extra.check(value)
        return value
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(ann)
        out = list(value)
        for i, element in enumerate(value):
            try:
                out[i] = _check_value(item, element)
            except KeyedValueError as exc:
                raise KeyedValueError(f"[{i}].{exc.key}" if exc.key else f"[{i}]", exc.reason) from None
            except ValueError as exc:
                raise KeyedValueError(f"[{i}]", str(exc)) from None
        return out if any(a is not b for a, b in zip(out, value, strict=True)) else value
    if origin in (typing.Union, types.UnionType) and value is not None:
        for arg in typing.get_args(ann):
            if typing.get_origin(arg) is Annotated and isinstance(value, typing.get_args(arg)[0]):
                return _check_value(arg, value)
    return value


class Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every settings model (a :class:`msgspec.Struct`): strict types (a TOML string ``"19092"`` is not a
    port), unknown keys rejected, immutable; a field is ``name: Annotated[T, Meta(ge=..., description=...)] =
    default``. Its checks (:class:`AfterValidator`, :func:`field_validator`, :func:`model_validator`) run whenever
    one is made, from a file or in code, defaults included."""

    #: fields never shown in a repr or a ConfigError message (passwords, tokens)
    secret_fields: ClassVar[frozenset[str]] = frozenset()
    #: keys that are not this section's, each with what to say instead of "unknown key" (e.g. Kafka's name of a
    #: setting that Sluice names otherwise)
    renamed_keys: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        checks = _checks_of(type(self))
        for name, ann, validators in checks.fields:
            value = old = getattr(self, name)
            try:
                value = _check_value(ann, value)
                for validator in validators:
                    value = validator(value)
            except KeyedValueError as exc:
                sep = "" if exc.key.startswith("[") else "."
                raise ValueError(_KEYED.format(key=f"{name}{sep}{exc.key}" if exc.key else name,
                                               reason=exc.reason)) from None
            except ValueError as exc:
                raise ValueError(_KEYED.format(key=name, reason=exc)) from None
            if value is not old:
                force_setattr(self, name, value)
        for validator in checks.models:
            try:
                validator(self)
            except KeyedValueError as exc:
                raise ValueError(_KEYED.format(key=exc.key, reason=exc.reason)) from None
            except ValueError as exc:
                raise ValueError(_KEYED.format(key="", reason=exc)) from None

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [(name, "***" if name in self.secret_fields else getattr(self, name))
                for name in self.__struct_fields__]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__rich_repr__())})"

    @classmethod
    def model_validate(cls, data: Any) -> Self:
        """``data`` (TOML's or JSON's types) as this section, every check run; :class:`Invalid` says where not."""
        try:
            return msgspec.convert(data, cls, strict=True)
        except msgspec.ValidationError as exc:
            raise Invalid.from_msgspec(str(exc), data) from None

    def model_dump(self) -> dict[str, Any]:
        """The section as TOML's and JSON's types (nested sections as dicts)."""
        return typing.cast(dict[str, Any], msgspec.to_builtins(self))

    def model_copy(self, *, update: Mapping[str, Any]) -> Self:
        """A copy with ``update``'s fields replaced, checked like any section made."""
        return msgspec.structs.replace(self, **update)

    @classmethod
    def field_types(cls) -> dict[str, Any]:
        """Each field's annotation (``Annotated`` kept: its Meta holds the constraints and the description)."""
        return {name: ann for name, ann, _ in _checks_of(cls).fields}


class Invalid(ValueError):
    """Data that is no valid section: ``loc`` (the path of the offending key: names and list
    indices), ``reason``, and ``kind``: "unknown" (a key no section has), "type" (the type or a bound of the
    value at ``loc``: it is worth echoing) or "value" (a check's own message)."""

    def __init__(self, loc: tuple[str | int, ...], reason: str, kind: str) -> None:
        super().__init__(reason)
        self.loc, self.reason, self.kind = loc, reason, kind

    @classmethod
    def from_msgspec(cls, text: str, data: Any) -> Invalid:
        message, _, path = text.rpartition(" - at `")
        if not _:
            message, path = text, "$`"
        loc: list[str | int] = [int(p) if p.isdigit() else p
                                for p in re.findall(r"\.([^.\[`]+)|\[(\d+)\]", path.removesuffix("`")) for p in p if p]
        if (m := _KEYED_RE.fullmatch(message)) is not None:
            loc += [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", m[1])]
            return cls(tuple(loc), m[2], "value")
        if (m := re.fullmatch(r"Object contains unknown field `(.*)`", message)) is not None:
            return cls((*loc, m[1]), "unknown key", "unknown")
        if (m := re.fullmatch(r"Object missing required field `(.*)`", message)) is not None:
            return cls((*loc, m[1]), "field required", "value")
        if (m := re.fullmatch(r"Expected `([^`]+)`, got `[^`]+`", message)) is not None:
            names = [_TYPE_NAMES.get(t, t) for t in m[1].split(" | ") if t != "null"]  # None: the key left out
            return cls(tuple(loc), f"expected {' or '.join(names)}", "type")
        if (m := re.fullmatch(r"Expected `\w+` (<=|>=|<|>) (\S+)", message)) is not None:
            bound = m[2].removesuffix(".0")
            return cls(tuple(loc), f"must be {_BOUNDS[m[1]]} {bound}", "type")
        if message.startswith("Invalid enum value"):
            return cls(tuple(loc), "is not one of the choices", "type")
        reason = message.replace("`", "")
        return cls(tuple(loc), reason[:1].lower() + reason[1:], "type")


#: msgspec's names of the types TOML has, as a config error says them
_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "a boolean (true or false)", "str": "a string",
               "array": "a list", "object": "a table", "null": "nothing"}
_BOUNDS = {"<=": "at most", ">=": "at least", "<": "less than", ">": "greater than"}


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
Port = Annotated[int, Meta(ge=0, le=65535)]
Seconds = Annotated[float, Meta(gt=0)]
# Kafka frames carry an int32 length, so nothing larger can ever be valid.
FrameBytes = Annotated[int, Meta(gt=0, le=2**31 - 1)]


# -------------------------------------------------------------------------------------------- sections





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


class ClientSelectorSettings(Section, kw_only=True, frozen=True):
    """A client selector (proxy/core/selectors.py), e.g. one entry of a policy's list of consumers: consumers
    (replica_id < 0) a rule applies to; the selectors given must all match."""

    client_id: Annotated[str | None, Meta(description='client.id glob, e.g. "backfill-*".')] = None
    principal: Annotated[str | None, Meta(description="SASL principal glob.")] = None
    client_address: Annotated[Network, Meta(description="Client IP address or CIDR network.")] = None

    @field_validator("client_id", "principal")
    @classmethod
    def _glob(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError('must be a glob, e.g. "backfill-*" ("*" = every consumer)')
        return value

    @model_validator
    def _some(self) -> None:
        if self.client_id is None and self.principal is None and self.client_address is None:
            raise KeyedValueError("client_id", "set at least one of client_id, principal, client_address")
