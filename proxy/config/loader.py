"""The loader: a settings model composed from the core sections and the sections of whatever owns one (the
policies: the composition root, ``proxy/app.py``, hands them in), and where values come from: defaults <- TOML
file <- environment, typed and validated by msgspec (:class:`~proxy.config.base.Section`). It names no policy.

Sources, later wins:

1. defaults (the field defaults of the sections; ``config/sluice.toml`` documents each one);
2. a TOML file (``load_settings(path)``), read with :mod:`tomllib`;
3. environment variables ``SLUICE_<SECTION>__<KEY>`` (double underscore between the levels), e.g.
   ``SLUICE_UPSTREAM__BOOTSTRAP_SERVERS=127.0.0.1:9092,127.0.0.1:9093``, ``SLUICE_LISTEN__BOOTSTRAP_PORT=0``.
   Lists are comma-separated; booleans accept true/false/1/0/yes/no/on/off. A ``SLUICE_`` variable *with* a
   ``__`` must name a real key (a typo is an error, not silently ignored); variables without ``__``
   (``SLUICE_CONFIG``, anything rig/ or the tests use) are not overrides and are left alone.
4. the state file ``admin.state_file`` (:mod:`proxy.config.state`; ``sluice run`` and SIGHUP reloads, not
   ``load_settings``): the run-time changeable sections as last changed through the admin API, each replacing
   the whole section.

Every problem becomes one :class:`ConfigError` whose ``str()`` is a single line naming the dotted key, the
reason and where the value came from, e.g. ``listen.bootstrap_port: input should be less than or equal to
65535, got 70000 (in sluice.toml)``; the CLI prints it and exits 2.

Copies for tests (``proxy.app.load_settings``: this loader with Sluice's own settings model)::

    s = load_settings(None, env={})
    # validated, dotted keys:
    s2 = s.with_overrides({"listen.bootstrap_port": 0, "upstream.bootstrap_servers": [broker]})
    # one nested model_copy per section:
    s3 = s.model_copy(update={"listen": s.listen.model_copy(update={"bootstrap_port": 0})})

The sections: the core ones are fields of :class:`CoreSettings` (proxy/config/sections.py); a policy's section
is its registration's (``proxy/core/registration.py``), added by :func:`compose`. Either way a section is one model
class deriving from :class:`~proxy.config.base.Section`; env overrides, unknown-key errors and error messages then
work for it without further code (env overrides reach scalar and list-of-scalar keys only).
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, Self, TypeVar

import msgspec

from .base import ConfigError, Invalid, KeyedValueError, Section, hosts_overlap, model_validator, one_of, unwrap
from .sections import (
    AdminSettings,
    FleetSettings,
    LimitsSettings,
    ListenSettings,
    LoggingSettings,
    ShutdownSettings,
    UpstreamSettings,
)

_Model = TypeVar("_Model", bound=Section)
_Settings = TypeVar("_Settings", bound="CoreSettings")


class SectionOwner(Protocol):
    """What :func:`compose` reads of each thing that brings a section (a policy's registration)."""

    @property
    def section(self) -> str:
        """The TOML table ``[section]`` (env overrides ``SLUICE_<SECTION>__<KEY>``); "" = none."""
        ...

    @property
    def settings(self) -> type[Section] | None:
        """The section's settings model."""
        ...

    @property
    def dynamic(self) -> bool:
        """Whether the section changes at run time (admin API, SIGHUP, the state file)."""
        ...


ENV_PREFIX = "SLUICE_"
ENV_SEPARATOR = "__"

# -------------------------------------------------------------------------------------------- settings


class CoreSettings(Section, kw_only=True, frozen=True):
    """Sluice's core sections, one field per TOML section; :func:`compose` adds the policies' sections to make the
    settings model (:data:`Settings`).

    Sections are frozen, so one shared default instance per section is safe.
    """

    upstream: UpstreamSettings = UpstreamSettings()
    listen: ListenSettings = ListenSettings()
    limits: LimitsSettings = LimitsSettings()
    shutdown: ShutdownSettings = ShutdownSettings()
    admin: AdminSettings = AdminSettings()
    logging: LoggingSettings = LoggingSettings()
    fleet: FleetSettings = FleetSettings()
    #: what this model was composed from (the policies' registrations, in chain order)
    policies: ClassVar[tuple[Any, ...]] = ()
    #: their sections changeable while running (admin API, SIGHUP), and so the ones a state file holds
    dynamic_sections: ClassVar[tuple[str, ...]] = ()

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            """The policies' sections, fields of the composed model."""

    @model_validator
    def _cross_section(self) -> None:
        # A port shared by two listeners would fail at bind time with a less helpful message. (Broker node ids
        # are only known at run time, so only node 0's port, broker_port_base itself, can be checked here.)
        admin, listen = self.admin, self.listen
        if admin.enabled and admin.port and hosts_overlap(admin.host, listen.host):
            for name, port in (
                ("bootstrap_port", listen.bootstrap_port),
                ("broker_port_base", listen.broker_port_base),
            ):
                if admin.port == port:
                    raise KeyedValueError("admin.port", f"collides with listen.{name} ({port})")
        if not self.fleet.enabled:
            for registration in self.policies:
                key = registration.needs_fleet(getattr(self, registration.section)) if registration.needs_fleet else ""
                if key:
                    raise KeyedValueError(f"{registration.section}.{key}", "needs [fleet] enabled (the fleet shares "
                                                                           "it through its topics)")

    def with_overrides(self, overrides: Mapping[str, Any]) -> Self:
        """A validated copy with dotted keys replaced, e.g. ``{"listen.bootstrap_port": 0}``.

        Raises :class:`ConfigError` like :func:`load_settings`. (``model_copy(update=...)`` also works, raising
        ValueError, and needs one nested ``model_copy`` per section.)
        """
        data = self.model_dump()
        for dotted, value in overrides.items():
            _set_path(data, dotted.split("."), value)
        return _validate(type(self), data, {k: "from override" for k in overrides}, "from override")

    def redacted(self) -> dict[str, Any]:
        """``model_dump()`` with secrets replaced, for logging the effective configuration at start-up."""
        data = self.model_dump()
        if data["admin"]["token"]:
            data["admin"]["token"] = "***"
        for section in ("upstream", "fleet"):
            if data[section]["sasl"]["password"]:
                data[section]["sasl"]["password"] = "***"
        data["logging"]["access_log_kafka"]["properties"] = self.logging.access_log_kafka.redacted_properties()
        # file paths are not secrets (the files are); nothing else in the TLS sections is
        return data


def compose(policies: Sequence[SectionOwner]) -> type[CoreSettings]:
    """The settings model of a proxy with ``policies``: the core sections and each policy's section (after them,
    in list order), defaults included."""
    names = [r.section for r in policies if r.section]
    taken = {n for n in names if names.count(n) > 1 or n in CoreSettings.__struct_fields__}
    if taken:
        raise ValueError(f"sections registered twice: {', '.join(sorted(taken))}")
    sections = [(r.section, r.settings, msgspec.field(default_factory=r.settings)) for r in policies
                if r.settings is not None]
    model = typing.cast(type[CoreSettings], msgspec.defstruct("Settings", sections, bases=(CoreSettings,),
                                                               module=__name__, kw_only=True, frozen=True))
    model.policies = tuple(policies)
    model.dynamic_sections = tuple(r.section for r in policies if r.dynamic)
    return model


# --------------------------------------------------------------------------------------------- loading


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None, *,
                  model: type[_Settings]) -> _Settings:
    """Defaults <- TOML file at ``path`` (None = no file) <- ``env`` overrides (None = ``os.environ``), as a
    ``model`` (one :func:`compose` made).

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
        parsed = _parse_env(model, var, raw)
        if parsed is not None:
            parts, value = parsed
            _set_path(data, parts, value)
            sources[".".join(parts)] = f"from env {var}"
    return _validate(model, data, sources, default_source)


def _validate(model: type[_Model], data: dict[str, Any], sources: Mapping[str, str], default_source: str) -> _Model:
    try:
        return model.model_validate(data)
    except Invalid as exc:
        raise _to_config_error(model, exc, data, sources, default_source) from None


def _set_path(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is a value in the file, but a section is expected")
        node = child
    node[parts[-1]] = value





def _parse_env(root: type[Section], var: str, raw: str) -> tuple[list[str], Any] | None:
    """``SLUICE_A__B=raw`` -> (["a", "b"], typed value); None if ``var`` is not an override variable."""
    if not var.upper().startswith(ENV_PREFIX) or ENV_SEPARATOR not in var:
        return None
    parts = [p.lower() for p in var[len(ENV_PREFIX) :].split(ENV_SEPARATOR)]
    source = f"from env {var}"
    model: type[Section] = root
    for i, part in enumerate(parts):
        dotted = ".".join(parts[: i + 1])
        annotation = model.field_types().get(part)
        if annotation is None:
            raise ConfigError(dotted, _unknown_key_reason(part, model), source)
        ann = unwrap(annotation)
        if i < len(parts) - 1:
            if not _is_model(ann):
                raise ConfigError(dotted, "is a key, not a section", source)
            model = typing.cast(type[Section], ann)
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
        return [_coerce_env(unwrap(item), s.strip(), key, source) for s in raw.split(",") if s.strip()]
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


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, Section)


# ------------------------------------------------------------------------------------------ error text


def _unknown_key_reason(key: str, model: type[Section] | None) -> str:
    if model is None:
        return "unknown key"
    if key in model.renamed_keys:
        return model.renamed_keys[key]
    known = list(model.__struct_fields__)
    what = "section" if issubclass(model, CoreSettings) else "key"
    import difflib  # only a configuration error needs it (~0.25 MiB of every start otherwise)

    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"unknown {what} ({hint})"


def _walk(root: type[Section], loc: tuple[int | str, ...]) -> tuple[type[Section] | None, Any, bool]:
    """Follow ``loc`` from ``root``: (the model at ``loc``, or None if it is not a model; the type there, unwrapped;
    whether the last key is a secret field of its model)."""
    model: type[Section] | None = root
    ann: Any = None
    secret = False
    for part in loc:
        if isinstance(part, int):
            continue  # list index: the element type was already taken below
        if model is None or (annotation := model.field_types().get(part)) is None:
            return None, None, False
        secret = part in model.secret_fields
        ann = unwrap(annotation)
        if typing.get_origin(ann) is list:
            ann = unwrap(typing.get_args(ann)[0])
        model = typing.cast(type[Section], ann) if _is_model(ann) else None
    return model, ann, secret


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _at(data: Any, loc: tuple[int | str, ...]) -> Any:
    """The value at ``loc`` in the data validated (None if there is none)."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _to_config_error(root: type[Section], exc: Invalid, data: Any, sources: Mapping[str, str],
                     default_source: str) -> ConfigError:
    loc = exc.loc
    key = _dotted(loc)
    reason = exc.reason
    if exc.kind == "unknown":
        model, _, _ = _walk(root, loc[:-1])
        reason = _unknown_key_reason(str(loc[-1]), model)
    elif exc.kind == "type":
        _, ann, secret = _walk(root, loc)
        value = _at(data, loc)
        if typing.get_origin(ann) is Literal:
            reason = one_of(typing.get_args(ann))
        # Echo the offending value unless it is a secret or a whole section/list.
        if not secret and not isinstance(value, dict | list):
            text = repr(value)
            reason += f", got {text if len(text) <= 80 else text[:77] + '...'}"
    # Most specific source first: the key itself, then its section, then the file.
    base_key = key.split("[", 1)[0]
    source = sources.get(base_key) or sources.get(base_key.rsplit(".", 1)[0]) or default_source
    return ConfigError(key, reason, source)
