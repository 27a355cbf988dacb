"""Kafka's own Java client tools (console and perf producer/consumer, kafka-topics) as a real client.

They run from the same jars as the rig's broker (`rig.kafka.find_libs()`), against any bootstrap address: the
broker's, or the proxy's in front of it. Each call is a subprocess with a timeout; nothing is left running
except what `spawn()` hands back to the caller.

Class names in Kafka 4.1 (checked with `unzip -l kafka-tools-4.1.2.jar`): the console consumer moved to
`org.apache.kafka.tools.consumer.ConsoleConsumer`; the console producer, perf tools and TopicCommand are
`org.apache.kafka.tools.*`. The Scala `kafka.tools.*` versions are gone (except the broker's StorageTool).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rig.kafka import (
    RigError,
    cds_finish,
    cds_options,
    classpath,
    find_java,
    find_libs,
    main_thread_pdeathsig,
)

CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
PRODUCER_PERFORMANCE = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERFORMANCE = "org.apache.kafka.tools.ConsumerPerformance"
TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"

VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
CONSOLE_SHARE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleShareConsumer"
SHARE_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"
FEATURE_COMMAND = "org.apache.kafka.tools.FeatureCommand"
CONFIG_COMMAND = "kafka.admin.ConfigCommand"

# KIP-1147 (Kafka 4.2) renamed the tools' options to one scheme; the old names still work but print a deprecation line
# on stdout, the stream tests parse records from. Callers write the names every supported release knows (4.1's);
# `command()` passes the new names to a release that has them. (main class -> old name -> new name)
RENAMED_OPTIONS: dict[str, dict[str, str]] = {
    CONSOLE_CONSUMER: {"--property": "--formatter-property", "--consumer-property": "--command-property",
                       "--consumer.config": "--command-config"},
    CONSOLE_SHARE_CONSUMER: {"--property": "--formatter-property", "--consumer-property": "--command-property",
                             "--consumer-config": "--command-config"},
    CONSOLE_PRODUCER: {"--property": "--reader-property", "--producer-property": "--command-property",
                       "--producer.config": "--command-config"},
    CONSUMER_PERFORMANCE: {"--messages": "--num-records", "--consumer.config": "--command-config"},
    VERIFIABLE_PRODUCER: {"--producer.config": "--command-config"},
}
RENAMED_IN = (4, 2)


def libs_version(libs_dir: Path) -> tuple[int, ...]:
    """The Kafka release of a libs dir, from its kafka-clients jar's name (e.g. (4, 3, 1))."""
    for jar in libs_dir.glob("kafka-clients-*.jar"):
        digits = re.match(r"kafka-clients-(\d+)\.(\d+)\.(\d+)", jar.name)
        if digits:
            return tuple(int(d) for d in digits.groups())
    raise RigError(f"no kafka-clients-X.Y.Z.jar in {libs_dir}")


# Short-lived tools: start-up dominates, so C1 only (TieredStopAtLevel=1), no GC threads, small heap. Measured on
# the 2-core machine, C1-only saves roughly a third of a console tool's wall time.
FAST_JVM_OPTS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# Perf tools run long enough for C2 to pay off; the client must not be the bottleneck of a throughput figure.
PERF_JVM_OPTS: tuple[str, ...] = (
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)

# Tools log WARN and above to stderr; their results (records, perf lines) are on stdout.
_LOG4J2_TOOLS = """\
# Written by rig/java_tools.py: Kafka tools log warnings to stderr only.
status = error
name = sluice-rig-tools
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
"""

_PRODUCER_SUMMARY = re.compile(
    r"(?P<records>\d+) records sent, (?P<records_per_sec>[\d.]+) records/sec \((?P<mb_per_sec>[\d.]+) MB/sec\), "
    r"(?P<avg_latency_ms>[\d.]+) ms avg latency, (?P<max_latency_ms>[\d.]+) ms max latency, "
    r"(?P<p50_ms>\d+) ms 50th, (?P<p95_ms>\d+) ms 95th, (?P<p99_ms>\d+) ms 99th, (?P<p999_ms>\d+) ms 99.9th"
)


@dataclass(frozen=True)
class PerfResult:
    """A perf tool's summary. `metrics` keeps every figure the tool printed, by a snake_case name."""

    records: int
    records_per_sec: float
    mb_per_sec: float
    metrics: dict[str, float] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""


def parse_producer_perf(stdout: str, stderr: str = "") -> PerfResult:
    """The final summary line of ProducerPerformance (the one with percentiles; earlier lines are windows)."""
    matches = list(_PRODUCER_SUMMARY.finditer(stdout))
    if not matches:
        raise RigError(f"no ProducerPerformance summary in its output:\n{stdout}\n{stderr}")
    metrics = {k: float(v) for k, v in matches[-1].groupdict().items()}
    return PerfResult(
        records=int(metrics["records"]),
        records_per_sec=metrics["records_per_sec"],
        mb_per_sec=metrics["mb_per_sec"],
        metrics=metrics,
        stdout=stdout,
        stderr=stderr,
    )


def parse_consumer_perf(stdout: str, stderr: str = "") -> PerfResult:
    """ConsumerPerformance prints a CSV header line then one line of values:
    start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, ...
    """
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("start.time"):
            names = [n.strip() for n in line.split(",")]
            values = [v.strip() for v in lines[i + 1].split(",")]
            metrics: dict[str, float] = {}
            for name, value in zip(names, values, strict=False):
                with contextlib.suppress(ValueError):  # start.time/end.time are dates
                    metrics[name.replace(".", "_")] = float(value)
            try:
                return PerfResult(
                    records=int(metrics["data_consumed_in_nMsg"]),
                    records_per_sec=metrics["nMsg_sec"],
                    mb_per_sec=metrics["MB_sec"],
                    metrics=metrics,
                    stdout=stdout,
                    stderr=stderr,
                )
            except KeyError:
                break
    raise RigError(f"no ConsumerPerformance summary in its output:\n{stdout}\n{stderr}")


def _props_args(flag: str, props: Mapping[str, object] | None) -> list[str]:
    args: list[str] = []
    for key, value in (props or {}).items():
        args += [flag, f"{key}={_prop_value(value)}"]
    return args


def _prop_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class JavaTools:
    """Runs Kafka's Java tools from the rig's jars. Every method takes the bootstrap address to talk to."""

    def __init__(self, libs_dir: Path | str | None = None, *, java: str | None = None) -> None:
        self.libs_dir = Path(libs_dir).resolve() if libs_dir is not None else find_libs()
        self.java = java or find_java()
        self._tmp = Path(tempfile.mkdtemp(prefix="sluice-tools-"))
        self._log4j = self._tmp / "log4j2.properties"
        self._log4j.write_text(_LOG4J2_TOOLS)
        self._counter = 0
        self.version = libs_version(self.libs_dir)
        atexit.register(self.close)

    @property
    def log4j_config(self) -> Path:
        """The rig's log4j2 configuration (warnings to stderr), for Java programs the rig runs itself."""
        return self._log4j

    def close(self) -> None:
        """Remove the temp files (log4j2 config, consumer configs)."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    # ---- generic -----------------------------------------------------------------------------------------

    def command(
        self,
        main_class: str,
        args: Sequence[str],
        *,
        jvm_opts: Sequence[str] = FAST_JVM_OPTS,
        extra_jvm_opts: Sequence[str] = (),
        log4j_config: Path | None = None,
    ) -> list[str]:
        """The full java command line for a tool (for logging, or to run it some other way).

        `log4j_config`: a log4j2 configuration file to use instead of the rig's (warnings to stderr), e.g. to
        capture a client class's DEBUG lines in a file."""
        return [
            self.java,
            *jvm_opts,
            *extra_jvm_opts,
            f"-Dlog4j2.configurationFile={log4j_config or self._log4j}",
            "-cp",
            classpath(self.libs_dir),
            main_class,
            *self._current_options(main_class, args),
        ]

    def _current_options(self, main_class: str, args: Sequence[str]) -> list[str]:
        renamed = RENAMED_OPTIONS.get(main_class) if self.version >= RENAMED_IN else None
        return [renamed.get(a, a) for a in args] if renamed else list(args)

    def run(
        self,
        main_class: str,
        args: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = True,
        jvm_opts: Sequence[str] = FAST_JVM_OPTS,
        log4j_config: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a tool to completion. With `check`, a non-zero exit is a RigError carrying the tool's output.

        On timeout the tool is killed (subprocess.run does that) and a RigError says so, with its output so far.
        """
        # Class-data sharing archive per tool: JVM start is most of a console tool's run (see rig.kafka).
        cds, pending = cds_options(self.java, self.libs_dir, main_class, jvm_opts)
        cmd = self.command(main_class, args, jvm_opts=jvm_opts, extra_jvm_opts=cds, log4j_config=log4j_config)
        try:
            proc = subprocess.run(
                cmd,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=None if input is not None else subprocess.DEVNULL,
                preexec_fn=main_thread_pdeathsig(),  # only sets PDEATHSIG
            )
        except subprocess.TimeoutExpired as exc:
            cds_finish(pending, clean_exit=False)
            out = _text(exc.stdout) + _text(exc.stderr)
            raise RigError(f"{main_class} timed out after {timeout:.0f}s: {' '.join(args)}\n{_last(out)}") from exc
        cds_finish(pending, clean_exit=proc.returncode == 0)
        if check and proc.returncode != 0:
            raise RigError(
                f"{main_class} exited with {proc.returncode}: {' '.join(args)}\n{_last(proc.stdout + proc.stderr)}"
            )
        return proc

    def spawn(
        self,
        main_class: str,
        args: Sequence[str],
        *,
        jvm_opts: Sequence[str] = FAST_JVM_OPTS,
        stdin: int | None = subprocess.DEVNULL,
        log4j_config: Path | None = None,
    ) -> subprocess.Popen[str]:
        """Start a tool in the background (e.g. a consumer across a broker restart). The caller must stop it
        (terminate()/wait()); it also dies with this Python process (PR_SET_PDEATHSIG)."""
        cds, _ = cds_options(self.java, self.libs_dir, main_class, jvm_opts, create=False)
        return subprocess.Popen(
            self.command(main_class, args, jvm_opts=jvm_opts, extra_jvm_opts=cds, log4j_config=log4j_config),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=main_thread_pdeathsig(),
        )

    @contextlib.contextmanager
    def spawned(self, main_class: str, args_each: Sequence[Sequence[str]], *,
                timeout: float = 60.0) -> Iterator[list[subprocess.Popen[str]]]:
        """One :meth:`spawn` per argument list, all stopped on leaving the block: every one terminated first, then
        each waited for (``timeout`` s), so they close side by side (a share consumer's close acknowledges what it
        was handed and leaves its group: closing one at a time would hand the next one the first's records)."""
        procs = [self.spawn(main_class, args) for args in args_each]
        try:
            yield procs
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout)

    def _temp_properties(self, props: Mapping[str, object]) -> Path:
        self._counter += 1
        path = self._tmp / f"client-{os.getpid()}-{self._counter}.properties"
        path.write_text("".join(f"{k}={_prop_value(v)}\n" for k, v in props.items()))
        return path

    # ---- console producer / consumer ---------------------------------------------------------------------

    def console_produce(
        self,
        bootstrap: str,
        topic: str,
        lines: Iterable[str],
        *,
        key_separator: str | None = None,
        producer_props: Mapping[str, object] | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Produce one record per line (acks=all, the tool's default); with `key_separator`, "key<sep>value"."""
        args = ["--bootstrap-server", bootstrap, "--topic", topic]
        if key_separator is not None:
            args += ["--property", "parse.key=true", "--property", f"key.separator={key_separator}"]
        args += _props_args("--producer-property", producer_props)
        text = "".join(f"{line}\n" for line in lines)
        return self.run(CONSOLE_PRODUCER, args, input=text, timeout=timeout)

    def console_consume(
        self,
        bootstrap: str,
        topic: str,
        *,
        max_messages: int,
        from_beginning: bool = True,
        group: str | None = None,
        partition: int | None = None,
        print_key: bool = False,
        key_separator: str = "\t",
        idle_timeout_ms: int = 20_000,
        consumer_props: Mapping[str, object] | None = None,
        timeout: float = 60.0,
    ) -> list[str]:
        """Consume up to `max_messages` records; return their values (or "key<sep>value") as lines.

        The tool stops after `max_messages` or after `idle_timeout_ms` without a record; fewer lines than asked
        for is then the caller's assertion to make, with this list in the message.
        """
        args = ["--bootstrap-server", bootstrap, "--topic", topic, "--max-messages", str(max_messages)]
        args += ["--timeout-ms", str(idle_timeout_ms)]
        if from_beginning:
            args.append("--from-beginning")
        if group is not None:
            args += ["--group", group]
        if partition is not None:
            args += ["--partition", str(partition)]
        if print_key:
            args += ["--property", "print.key=true", "--property", f"key.separator={key_separator}"]
        args += _props_args("--consumer-property", consumer_props)
        # On an idle timeout the 4.1 tool logs "ERROR ... TimeoutException" but exits 0 with what it consumed on
        # stdout, so only a non-zero exit is an error here.
        proc = self.run(CONSOLE_CONSUMER, args, timeout=timeout)
        return proc.stdout.splitlines()

    # ---- perf tools --------------------------------------------------------------------------------------

    def producer_perf(
        self,
        bootstrap: str,
        topic: str,
        *,
        num_records: int,
        record_size: int = 100,
        throughput: int = -1,
        producer_props: Mapping[str, object] | None = None,
        timeout: float = 300.0,
        print_metrics: bool = False,
    ) -> PerfResult:
        """ProducerPerformance (`throughput=-1`: as fast as possible). Returns its final summary (with
        `print_metrics`, the client's metrics follow it in its stdout: `group:name:{tags} : value` lines)."""
        props = {"bootstrap.servers": bootstrap, **(producer_props or {})}
        args = [
            "--topic", topic,
            "--num-records", str(num_records),
            "--record-size", str(record_size),
            "--throughput", str(throughput),
            "--producer-props", *(f"{k}={_prop_value(v)}" for k, v in props.items()),
        ]  # fmt: skip
        if print_metrics:
            args.append("--print-metrics")
        proc = self.run(PRODUCER_PERFORMANCE, args, timeout=timeout, jvm_opts=PERF_JVM_OPTS)
        return parse_producer_perf(proc.stdout, proc.stderr)

    def consumer_perf(
        self,
        bootstrap: str,
        topic: str,
        *,
        messages: int,
        group: str | None = None,
        idle_timeout_ms: int = 60_000,
        consumer_props: Mapping[str, object] | None = None,
        timeout: float = 300.0,
    ) -> PerfResult:
        """ConsumerPerformance: consume `messages` records (from the beginning for a new group).

        ``idle_timeout_ms`` is the tool's --timeout, the longest wait for a record, counted from its start too: a
        hang guard, never reached by a run that gets its records, so it is wide. The group join comes inside it: a
        JVM niced below three test sessions on a loaded CI machine can take more than 10 s to join, and then stops
        with fewer records than asked (the likeliest cause of bench.passthrough's one CI failure at 10 s)."""
        args = [
            "--bootstrap-server", bootstrap,
            "--topic", topic,
            "--messages", str(messages),
            "--timeout", str(idle_timeout_ms),
        ]  # fmt: skip
        if group is not None:
            args += ["--group", group]
        if consumer_props:
            args += ["--consumer.config", str(self._temp_properties(consumer_props))]
        proc = self.run(CONSUMER_PERFORMANCE, args, timeout=timeout, jvm_opts=PERF_JVM_OPTS)
        return parse_consumer_perf(proc.stdout, proc.stderr)

    # ---- kafka-topics ------------------------------------------------------------------------------------

    def topics(self, bootstrap: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """`kafka-topics.sh --bootstrap-server BOOTSTRAP ARGS...` (TopicCommand)."""
        return self.run(TOPIC_COMMAND, ["--bootstrap-server", bootstrap, *args], timeout=timeout)

    def create_topic(
        self,
        bootstrap: str,
        topic: str,
        *,
        partitions: int = 1,
        replication_factor: int = 1,
        config: Mapping[str, object] | None = None,
        timeout: float = 60.0,
    ) -> None:
        args = ["--create", "--topic", topic, "--partitions", str(partitions)]
        args += ["--replication-factor", str(replication_factor)]
        args += _props_args("--config", config)
        self.topics(bootstrap, *args, timeout=timeout)

    def list_topics(self, bootstrap: str, *, timeout: float = 60.0) -> list[str]:
        return [t for t in self.topics(bootstrap, "--list", timeout=timeout).stdout.splitlines() if t.strip()]

    def describe_topic(self, bootstrap: str, topic: str, *, timeout: float = 60.0) -> str:
        return self.topics(bootstrap, "--describe", "--topic", topic, timeout=timeout).stdout

    def share_group_from_earliest(self, bootstrap: str, group: str) -> None:
        """Share groups on (share.version=1: a new cluster's default from 4.2, GA; to be set on 4.1, a preview; a
        no-op when set) and ``group`` starting at the log start: a share group starts at the log end by default
        (share.auto.offset.reset), so records produced before it are its too."""
        self.run(FEATURE_COMMAND, ["--bootstrap-server", bootstrap, "upgrade", "--feature", "share.version=1"])
        self.run(CONFIG_COMMAND, ["--bootstrap-server", bootstrap, "--alter", "--entity-type", "groups",
                                  "--entity-name", group, "--add-config", "share.auto.offset.reset=earliest"])


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _last(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
