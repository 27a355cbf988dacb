"""The state file (``admin.state_file``): the run-time changeable sections as last changed through the admin API,
saved atomically and applied over the config file at start-up (``sluice run``) and on every SIGHUP.

The file is JSON: ``{"version": 1, "<section>": {...the whole section...}, ...}``, one entry per section
changed, each one of the settings model's ``dynamic_sections``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from .base import ConfigError
from .loader import CoreSettings

_Settings = TypeVar("_Settings", bound=CoreSettings)

STATE_KEY = "admin.state_file"
#: ``"version"`` in the state file: a later Sluice that changes the format can tell an old file from its own.
STATE_VERSION = 1


def read_state(path: str, dynamic: Sequence[str]) -> dict[str, Any]:
    """The sections saved in the state file at ``path`` (``{}`` when there is no file yet: nothing was changed
    through the admin API). Raises :class:`ConfigError` naming ``admin.state_file`` if it cannot be read or is
    not a state file or holds a section that is not one of ``dynamic``; each section's values are validated by
    :func:`apply_state_file`."""
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
        if key != "version" and key not in dynamic:
            raise ConfigError(STATE_KEY, f"{path}: unknown section {key!r} (a state file holds "
                                         f"{', '.join(dynamic)}); fix or delete it")
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


def save_state_section(path: str, section: str, values: Mapping[str, Any], dynamic: Sequence[str]) -> None:
    """Save one dynamic section (its whole ``model_dump()``) in the state file, keeping the other sections saved
    there. Raises :class:`ConfigError` naming ``admin.state_file`` if the file cannot be read or written."""
    sections = read_state(path, dynamic)
    sections[section] = dict(values)
    try:
        write_state(path, sections)
    except OSError as exc:
        raise ConfigError(STATE_KEY, f"cannot write {path}: {exc.strerror or exc}") from None


def apply_state_file(settings: _Settings, path: str | None = None) -> _Settings:
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
    sections = read_state(path, settings.dynamic_sections)
    if not sections:
        return settings
    try:
        return settings.with_overrides(sections)
    except ConfigError as exc:
        raise ConfigError(STATE_KEY, f"{path}: {exc.key}: {exc.reason}; fix or delete it") from None


# ------------------------------------------------------------------------------------------ env values
