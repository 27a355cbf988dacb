"""The ``sluice`` command (also ``python -m proxy``).

    sluice run [--config FILE]        run the proxy (FILE defaults to $SLUICE_CONFIG, else built-in defaults)
    sluice check-config FILE          validate FILE (+ SLUICE_* env overrides unless --no-env); "ok: FILE"
    sluice version | sluice --version print the version
    sluice throttle status|set|clear|plan   replication throttles (proxy/cli_throttle.py)
    sluice quota status|set|clear     client quotas (proxy/cli_quota.py)
    sluice fleet status|history|rollback   the fleet's instances, its changes, a rollback (proxy/fleet/cli.py)
    sluice config get|set|clear SECTION    every run-time changeable section (proxy/cli_config.py)
    sluice report --logs PATH... --out DIR [--master local[2]|spark://...]
                                      Spark job over access logs: Parquet tables + DIR/report.html (proxy/analytics)
    sluice report --kafka HOST:PORT [--topic T] [--from TIME] [--to TIME] --out DIR
                                      the same over the access-log topic ([logging.access_log_kafka]), a time range
    sluice report --live DIR --out DIR2   the report of the per-minute tables `sluice stream` keeps current
    sluice report --table URI [--from TIME] [--to TIME] --out DIR2
                                      the report over the access log `sluice stream` lands (a Delta table)
    sluice stream --kafka HOST:PORT [--topic T] --out DIR [--once] [--table URI | --no-table]
                                      Structured Streaming: per-minute tables kept current from the topic, and
                                      every line landed in a table partitioned by time (default DIR/access_log)

Exit codes: 0 success, 2 invalid configuration or usage (argparse's own code for usage errors, so scripts can
treat "you gave me something wrong" uniformly), 1 a report job that failed, 130 interrupted before the server
took over signal handling. Missing or unreadable wire specs (proxy/codecs/, package data) are exit code 2 from
``run`` and ``check-config``, with one line naming the path.

Adding a subcommand is one ``_Command`` entry in ``COMMANDS``: a
function adding its arguments to its sub-parser and a function running it and returning the exit code.
Heavy imports (uvloop, the server, the admin server) happen inside the command that needs them, so ``check-config``
and ``version`` start fast.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any


def _import_prometheus_client_without_snappy() -> None:
    """prometheus_client's exposition module imports python-snappy when it is installed (beside Sluice, e.g. as
    kafka-python's codec), for the snappy compression of its remote-write and pushgateway clients, which Sluice never
    uses; that import maps cramjam's extension, ~1.6 MiB of every idle sidecar. Blocked while prometheus_client is
    first imported only: ``import snappy`` anywhere later works as ever."""
    if "prometheus_client" in sys.modules or "snappy" in sys.modules:
        return
    sys.modules["snappy"] = None  # type: ignore[assignment]  # None in sys.modules: that import raises ImportError
    try:
        import prometheus_client  # noqa: F401
    finally:
        del sys.modules["snappy"]


_import_prometheus_client_without_snappy()

from proxy.app import Settings, load_settings  # noqa: E402 (after the import above)
from proxy.config import ConfigError, apply_state_file  # noqa: E402

if TYPE_CHECKING:
    import asyncio

__all__ = ["COMMANDS", "EXIT_CONFIG", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
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


def _specs_missing() -> int | None:
    """Sluice's own wire specs (package data, proxy/codecs/) present and readable: None; else one line naming
    the path on stderr and exit code 2. Without them the proxy would accept connections it cannot serve."""
    from proxy.wire.schema import SpecsError, check_specs

    try:
        check_specs()
    except SpecsError as exc:
        print(f"install error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return None


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
        settings = apply_state_file(load_settings(args.config, os.environ))  # admin changes win (reconfigure.py)
    except ConfigError as exc:
        return _config_error(exc)
    if (code := _specs_missing()) is not None:
        return code

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


async def serve(settings: Settings, config_path: str | None = None) -> None:
    """`sluice run`: the proxy and its admin server until SIGTERM/SIGINT, then a graceful shutdown.
    SIGHUP re-reads ``config_path`` and applies the sections changeable at run time (proxy/reconfigure.py)."""
    import asyncio
    import gc
    import signal

    from proxy import reconfigure
    from proxy.accesslog import get_logger
    from proxy.admin import AdminServer
    from proxy.heap import keep_freed_memory, release_startup_garbage
    from proxy.server import Proxy

    log = get_logger("sluice.cli")
    heap = keep_freed_memory()  # before the first response is collected (proxy/heap.py)
    if heap is None:
        log.info("heap", thresholds="the C library's own")
    else:
        log.info("heap", **heap)
    proxy = Proxy(settings)
    fleet = usage = None
    if settings.fleet.enabled:  # the fleet's settings applied before anything listens (proxy/fleet/control.py)
        from proxy.fleet import routes as fleet_routes
        from proxy.fleet.control import FleetControl
        from proxy.fleet.usage import FleetUsage

        fleet = FleetControl(proxy)
        usage = FleetUsage(fleet)  # the fleet's quotas: the recent usage, read before anything listens

    async def readiness() -> bool:
        return (fleet is None or fleet.ready()) and await proxy.ready()

    admin: AdminServer | None = None
    store: reconfigure.SectionStore | None = fleet  # what SIGHUP lays over the file (the fleet's sections)
    if settings.admin.enabled:
        admin = AdminServer(settings.admin, readiness, proxy.metrics)
        store = reconfigure.add_routes(admin, proxy, fleet)
        if fleet is not None:
            fleet_routes.add_routes(admin, proxy, fleet)
        if fleet is not None and not settings.admin.authenticates:
            log.warning("admin_unauthenticated", changes="made by anyone who reaches the admin port, recorded "
                                                         "as anonymous", set="[admin] token_file, principals or "
                                                                             "client_ca_file")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reconfigure.reload_file, proxy, config_path, store)
    try:
        # The admin API first: /healthz answers while the fleet is read, and /readyz says whether it was.
        if admin is not None:
            await admin.start()
            log.info("admin_listening", host=settings.admin.host, port=admin.port)
        if fleet is not None:
            if not await _until_stopped(fleet.start(), stop):
                return
            assert usage is not None
            await usage.start()
        await proxy.start()
        if fleet is not None:
            fleet.serving()
        # Start-up built what Sluice keeps for its whole life (its modules, the settings, the policies, the
        # registry): objects that each full collection of the cyclic GC would walk again, for tens to hundreds of
        # milliseconds in the middle of requests (the soak's p99, docs/PERFORMANCE.md). Frozen, the collector leaves
        # them alone (gc.freeze, CPython's advice for long-running processes). The specs and codecs of the APIs
        # clients use are built on their first decode (proxy/wire/schema.py), after this.
        gc.collect()
        gc.freeze()
        release_startup_garbage()  # what start-up freed, back to the kernel (proxy/heap.py)
        await stop.wait()
    finally:
        log.info("shutting_down", drain_timeout_s=settings.shutdown.drain_timeout_s)
        if usage is not None:
            await usage.stop()
        if fleet is not None:
            await fleet.stop()
        await proxy.stop()
        if admin is not None:
            await admin.stop()


async def _until_stopped(starting: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run ``starting`` unless ``stop`` is set first (SIGTERM while the fleet is awaited): whether it finished."""
    import asyncio
    import contextlib

    task = asyncio.ensure_future(starting)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


def _serve(settings: Settings, config_path: str | None = None) -> int:
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
    except ConfigError as exc:  # found while starting, e.g. a librdkafka property of the access-log sink
        return _config_error(exc)
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
        settings = load_settings(args.file, {} if args.no_env else os.environ)
        from proxy.tls import TlsContexts

        TlsContexts(settings)  # certificates and keys that cannot be used together fail here, not at run
    except ConfigError as exc:
        return _config_error(exc)
    if (code := _specs_missing()) is not None:
        return code
    print(f"ok: {args.file}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------- report


def _kafka_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", default="sluice-access-log",
                   help="the access-log topic (logging.access_log_kafka.topic; default sluice-access-log)")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="Kafka consumer setting, e.g. security.protocol=SSL (repeatable)")


def _spark_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default="local[2]",
                   help="Spark master: local[N] (default local[2], bound to 127.0.0.1) or a cluster's, e.g. "
                        "spark://host:7077")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)")


def _report_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--logs", nargs="+", metavar="PATH",
                        help="access-log files, directories (read recursively) or globs; .gz files are decompressed")
    source.add_argument("--kafka", metavar="HOST:PORT[,...]",
                        help="read the access-log topic from this cluster instead (--topic, --from, --to)")
    source.add_argument("--live", metavar="DIR",
                        help="report the per-minute tables `sluice stream --out DIR` keeps current")
    source.add_argument("--table", metavar="URI",
                        help="read the access log `sluice stream` lands (default DIR/access_log of its --out): "
                             "parsed once, read by column (--from, --to read only their partitions)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: report.html, summary.json and parquet/<table>/")
    _kafka_arguments(p)
    p.add_argument("--from", dest="start", metavar="TIME",
                   help="with --kafka or --table: records from this time (ISO-8601, UTC unless it says otherwise; "
                        "default: the earliest)")
    p.add_argument("--to", dest="end", metavar="TIME",
                   help="with --kafka or --table: records before this time (default: the latest when the job "
                        "starts)")
    _spark_arguments(p)
    p.add_argument("--bucket", metavar="DURATION",
                   help="time bucket of the over-time charts, e.g. 10s, 5m (default: from the span of the logs)")
    p.add_argument("--rate-window", default="10s", metavar="DURATION",
                   help="window of the inbound-rate measurement behind the throttle recommendation (default 10s)")
    p.add_argument("--move-bytes", metavar="SIZE",
                   help="bytes of the planned replica move, e.g. 500GiB: the report recommends a throttle for it")
    p.add_argument("--move-within", default="1h", metavar="DURATION",
                   help="time the move should take (default 1h)")
    p.add_argument("--network-bps", default="125M", metavar="RATE",
                   help="network throughput per broker, bytes/s (default 125M: 1 Gbit/s)")
    p.add_argument("--replication-factor", type=int, default=3, metavar="R", help="default 3")
    p.add_argument("--parquet-out", metavar="URI",
                   help="where the Parquet tables go (default DIR/parquet; on a cluster, a filesystem the "
                        "executors share, e.g. hdfs://...)")


def _missing_inputs(paths: list[str]) -> list[str]:
    """Local paths (and globs) that match nothing: reported before paying for a Spark start. URIs (hdfs://, s3a://)
    are left to Spark."""
    missing = []
    for path in paths:
        if "://" in path:
            continue
        if glob.has_magic(path) and glob.glob(path):
            continue
        if not os.path.exists(path):
            missing.append(path)
    return missing


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} takes KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def _time(text: str | None, flag: str) -> datetime | None:
    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{flag} takes an ISO-8601 time, e.g. 2025-01-31T12:00:00Z, got {text!r}") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _report(args: argparse.Namespace) -> int:
    from proxy.analytics.kip73 import ThrottleInputs
    from proxy.analytics.units import parse_bytes, parse_duration

    def usage(message: str) -> int:
        print(f"report: {message}", file=sys.stderr)
        return EXIT_CONFIG

    try:
        bucket_s = round(parse_duration(args.bucket)) if args.bucket else None
        rate_window_s = round(parse_duration(args.rate_window))
        throttle = ThrottleInputs(
            network_bps=float(parse_bytes(args.network_bps)),
            replication_factor=args.replication_factor,
            move_bytes=parse_bytes(args.move_bytes) if args.move_bytes else None,
            move_within_s=parse_duration(args.move_within),
        )
    except ValueError as exc:
        return usage(str(exc))
    if (bucket_s is not None and bucket_s < 1) or rate_window_s < 1 or throttle.move_within_s <= 0:
        return usage("--bucket, --rate-window and --move-within must be at least 1 second")
    if args.replication_factor < 1:
        return usage("--replication-factor must be at least 1")
    try:
        conf = _pairs(args.conf, "--conf")
        kafka_options = _pairs(args.kafka_option, "--kafka-option")
        start, end = _time(args.start, "--from"), _time(args.end, "--to")
    except ValueError as exc:
        return usage(str(exc))
    if (start or end) and not (args.kafka or args.table):
        return usage("--from and --to select records of the topic or the table: use them with --kafka or --table")
    if start and end and start >= end:
        return usage("--from must be before --to")
    if args.logs or args.table:
        missing = _missing_inputs(args.logs or [args.table])
        if missing:
            return usage(f"no such file or directory: {', '.join(missing)}")
    try:
        from proxy.analytics.job import JobOptions, Logs, run_job
        from proxy.analytics.landed import LandedTable
        from proxy.analytics.minutes import live_report
        from proxy.analytics.session import build_session
        from proxy.analytics.source import KafkaTopic
    except ImportError as exc:
        return usage(f"needs the analytics extra (pip install 'kafka-sluice[analytics]'): {exc}")

    options = JobOptions(bucket_s=bucket_s, rate_window_s=rate_window_s, throttle=throttle,
                         parquet_uri=args.parquet_out)
    source: Logs = args.logs
    if args.kafka:
        source = KafkaTopic(args.kafka, args.topic, start, end, kafka_options)
    elif args.table:
        source = LandedTable(args.table, start, end)
    spark = build_session(args.master, conf=conf, kafka=bool(args.kafka), delta=bool(args.table))
    try:
        if args.live:
            summary = live_report(spark, args.live, args.out)
        else:
            summary = run_job(spark, source, args.out, options,
                              progress=lambda m: print(m, file=sys.stderr)).summary()
    except Exception as exc:  # Spark's errors arrive as Py4J/Analysis exceptions: one line, then exit 1
        print(f"report failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        spark.stop()
    print(json.dumps(summary))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------- stream


def _stream_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kafka", required=True, metavar="HOST:PORT[,...]", help="the cluster of the access-log topic")
    _kafka_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="DIR/tables (the per-minute tables, current) and DIR/checkpoint (where the stream is); on a "
                        "cluster, a filesystem the executors share")
    p.add_argument("--from", dest="start", metavar="TIME",
                   help="on the stream's first start: records from this time (default: the earliest); afterwards "
                        "the checkpoint says where to go on")
    p.add_argument("--trigger", default="10s", metavar="DURATION", help="micro-batch interval (default 10s)")
    p.add_argument("--once", action="store_true",
                   help="process what the topic holds now, then stop (for a scheduler instead of a service)")
    p.add_argument("--keep", metavar="DURATION", help="drop minutes older than this from the tables (default: keep)")
    p.add_argument("--max-records", type=int, metavar="N", help="at most N records per micro-batch")
    land = p.add_mutually_exclusive_group()
    land.add_argument("--table", metavar="URI",
                      help="land every access-log line in this Delta table, partitioned by date and hour, for "
                           "`sluice report --table` (default DIR/access_log)")
    land.add_argument("--no-table", action="store_true", help="keep only the per-minute tables")
    _spark_arguments(p)


def _stream(args: argparse.Namespace) -> int:
    from proxy.analytics.units import parse_duration

    def usage(message: str) -> int:
        print(f"stream: {message}", file=sys.stderr)
        return EXIT_CONFIG

    try:
        conf = _pairs(args.conf, "--conf")
        kafka_options = _pairs(args.kafka_option, "--kafka-option")
        start = _time(args.start, "--from")
        trigger_s = parse_duration(args.trigger)
        keep_s = round(parse_duration(args.keep)) if args.keep else None
    except ValueError as exc:
        return usage(str(exc))
    if trigger_s <= 0 or (keep_s is not None and keep_s < 60):
        return usage("--trigger must be positive and --keep at least a minute")
    try:
        from proxy.analytics.live import run_stream
        from proxy.analytics.session import build_session
        from proxy.analytics.source import KafkaTopic
    except ImportError as exc:
        return usage(f"needs the analytics extra (pip install 'kafka-sluice[analytics]'): {exc}")
    table = None if args.no_table else args.table or f"{args.out.rstrip('/')}/access_log"
    spark = build_session(args.master, app_name="sluice-stream", conf=conf, kafka=True, delta=table is not None)
    try:
        run_stream(spark, KafkaTopic(args.kafka, args.topic, start, None, kafka_options), args.out,
                   trigger_s=trigger_s, once=args.once, keep_s=keep_s, max_records_per_batch=args.max_records,
                   table=table, progress=lambda m: print(m, file=sys.stderr))
    except Exception as exc:
        print(f"stream failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        spark.stop()
    return EXIT_OK


# --------------------------------------------------------------------------------------------------- version


def _version(_args: argparse.Namespace) -> int:
    from proxy.metrics import sluice_version

    print(f"sluice {sluice_version()}")
    return EXIT_OK


# -------------------------------------------------------------------------------------------------- throttle


def _throttle_arguments(p: argparse.ArgumentParser) -> None:
    from proxy import cli_throttle

    cli_throttle.add_arguments(p)


def _throttle(args: argparse.Namespace) -> int:
    from proxy import cli_throttle

    return cli_throttle.run(args)


def _quota_arguments(p: argparse.ArgumentParser) -> None:
    from proxy import cli_quota

    cli_quota.add_arguments(p)


def _quota(args: argparse.Namespace) -> int:
    from proxy import cli_quota

    return cli_quota.run(args)


# ----------------------------------------------------------------------------------------------------- fleet


def _fleet_arguments(p: argparse.ArgumentParser) -> None:
    from proxy.fleet import cli as fleet_cli

    fleet_cli.add_arguments(p)


def _fleet(args: argparse.Namespace) -> int:
    from proxy.fleet import cli as fleet_cli

    return fleet_cli.run(args)


# ---------------------------------------------------------------------------------------------------- config


def _config_arguments(p: argparse.ArgumentParser) -> None:
    from proxy import cli_config

    cli_config.add_arguments(p)


def _config(args: argparse.Namespace) -> int:
    from proxy import cli_config

    return cli_config.run(args)


COMMANDS: tuple[_Command, ...] = (
    _Command("run", "run the proxy", _run_arguments, _run),
    _Command("check-config", "validate a settings file and exit", _check_config_arguments, _check_config),
    _Command("version", "print the version", lambda _p: None, _version),
    _Command("throttle", "replication throttles (KIP-73): status | set | clear | plan", _throttle_arguments,
             _throttle),
    _Command("quota", "client quotas (KIP-13, KIP-124): status | set | clear", _quota_arguments, _quota),
    _Command("fleet", "a fleet of instances run as one: status | history | rollback", _fleet_arguments, _fleet),
    _Command("config", "every run-time changeable section: get | set | clear SECTION", _config_arguments, _config),
    _Command("report", "analyse access logs on Spark: Parquet aggregates and an HTML report", _report_arguments,
             _report),
    _Command("stream", "keep per-minute aggregates of the access-log topic current (Spark Structured Streaming)",
             _stream_arguments, _stream),
)


class _VersionAction(argparse.Action):
    """``sluice --version``: the same line as ``sluice version``, exit 0. The version is looked up only when the
    flag is given (argparse's own "version" action would need it at parser build time)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.exit(_version(namespace))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``only`` (a command's name), of that command's arguments alone: adding a
    command's arguments imports its module (the admin commands', the fleet's), which ``sluice run`` never needs."""
    parser = argparse.ArgumentParser(
        prog="sluice", description="Sluice: a Kafka wire-protocol proxy that meters fetch traffic."
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        if only is None or command.name == only:
            command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the command is the first word that is no option (the top level's options take no value)
    named = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(named if any(c.name == named for c in COMMANDS) else None).parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    return run(args)
