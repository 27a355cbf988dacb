"""The ``sluice`` command (also ``python -m proxy``).

    sluice run [--config FILE]        run the proxy (FILE defaults to $SLUICE_CONFIG, else built-in defaults)
    sluice check-config FILE          validate FILE (+ SLUICE_* env overrides unless --no-env); "ok: FILE"
    sluice version                    print the version

Exit codes: 0 success, 2 invalid configuration or usage (argparse's own code for usage errors, so scripts can
treat "you gave me something wrong" uniformly), 130 interrupted before the server took over signal handling.

Adding a subcommand (``throttle``, ``report`` are planned) is one ``_Command`` entry in ``COMMANDS``: a
function adding its arguments to its sub-parser and a function running it and returning the exit code.
Heavy imports (aiohttp, uvloop, the server) happen inside the command that needs them, so ``check-config``
and ``version`` start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.config import ConfigError, Settings, load_settings

__all__ = ["COMMANDS", "EXIT_CONFIG", "main"]

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class _Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _config_error(exc: ConfigError) -> int:
    print(f"config error: {exc}", file=sys.stderr)
    return EXIT_CONFIG


# ------------------------------------------------------------------------------------------------------- run


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        metavar="FILE",
        default=os.environ.get("SLUICE_CONFIG"),
        help="TOML settings file (default: $SLUICE_CONFIG; with neither, defaults + SLUICE_* env overrides)",
    )


def _run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config, os.environ)
    except ConfigError as exc:
        return _config_error(exc)

    from proxy.accesslog import configure_logging, get_logger

    try:
        configure_logging(settings.logging)
    except OSError as exc:
        return _config_error(
            ConfigError("logging.access_log", f"cannot open {settings.logging.access_log!r}: {exc.strerror}")
        )
    from proxy.metrics import sluice_version

    get_logger("sluice.cli").info(
        "starting", version=sluice_version(), config=args.config, settings=settings.redacted()
    )
    return _serve(settings, args.config)


def _serve(settings: Settings, config_path: str | None = None) -> int:
    from proxy.server import serve

    try:
        try:
            import uvloop
        except ImportError:  # uvloop does not exist on Windows; the proxy still works on asyncio's loop
            import asyncio

            result = asyncio.run(serve(settings, config_path))
        else:
            result = uvloop.run(serve(settings, config_path))
    except KeyboardInterrupt:  # Ctrl-C before serve() installed its own signal handlers
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else EXIT_OK


# ---------------------------------------------------------------------------------------------- check-config


def _check_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="TOML settings file to validate")
    p.add_argument(
        "--no-env",
        action="store_true",
        help="ignore SLUICE_* environment overrides (by default they apply, exactly as for `run`)",
    )


def _check_config(args: argparse.Namespace) -> int:
    try:
        load_settings(args.file, {} if args.no_env else os.environ)
    except ConfigError as exc:
        return _config_error(exc)
    print(f"ok: {args.file}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------------- version


def _version(_args: argparse.Namespace) -> int:
    from proxy.metrics import sluice_version

    print(f"sluice {sluice_version()}")
    return EXIT_OK


COMMANDS: tuple[_Command, ...] = (
    _Command("run", "run the proxy", _run_arguments, _run),
    _Command("check-config", "validate a settings file and exit", _check_config_arguments, _check_config),
    _Command("version", "print the version", lambda _p: None, _version),
    # planned: "throttle" (talks to the admin API's /throttles), "report" (summaries of the access log)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description="Sluice: a Kafka wire-protocol proxy that meters fetch traffic."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    return run(args)
