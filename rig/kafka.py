"""A real Apache Kafka 4.x broker for tests, benches and `make run`.

Kafka runs as one KRaft node in combined mode (broker + controller in one JVM), bound to 127.0.0.1 on free ports,
with its own temporary directory for config, data and logs. Nothing here mocks Kafka: if Java or the jars are
missing, that is an error, never a skip.

Where the jars come from, in order (ARCHITECTURE.md, "The real broker (rig)"):
  1. ``$KAFKA_HOME/libs`` when KAFKA_HOME is set (an unpacked official release);
  2. the cache ``${SLUICE_CACHE:-~/.cache/sluice}/kafka-<version>/libs`` when a previous fetch completed;
  3. Maven Central, via ``mvn dependency:copy-dependencies`` over ``rig/pom.xml``, into that cache;
  4. the official release tarball (archive.apache.org / downloads.apache.org), into that cache.

CLI: ``python -m rig.kafka fetch`` (make sure the jars are present, print the libs dir) and
``python -m rig.kafka start`` (run a broker until Ctrl-C).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import collections
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

# The Kafka releases the rig runs: the oldest Sluice supports and the newest whose jars (with every dependency)
# Maven Central serves. 4.4.0 is listed there, but its broker's dependency jetty-ee10-servlets 12.0.39 is not, so
# no 4.4.0 broker can be assembled from it. `make test` runs on the newest, `make test-kafka-oldest` on the oldest;
# `make install` fetches both.
KAFKA_OLDEST = "4.1.2"
KAFKA_NEWEST = "4.3.1"
KAFKA_VERSIONS: tuple[str, ...] = (KAFKA_OLDEST, KAFKA_NEWEST)
# The one setting that picks the release (the pom takes it too): SLUICE_KAFKA_VERSION, default the newest.
KAFKA_VERSION: str = os.environ.get("SLUICE_KAFKA_VERSION", KAFKA_NEWEST)
#: the heartbeat interval and session timeout the rig's brokers give KIP-848 consumer groups and share groups
#: (server_properties): what a test waits on for a group to settle or a killed member to be fenced
GROUP_HEARTBEAT_MS = 1000
GROUP_SESSION_MS = 10_000
#: how long a KIP-848 group through sharing Sluices must stay unchanged to count as settled (the tests and
#: bench.sharing): the broker moves a partition, and each Sluice hands or takes back its member's slices, at that
#: member's heartbeats, a move over two of them (revoke, then hand); a shorter window took a layout still on the
#: way as settled
KIP848_SETTLE_S = 3 * GROUP_HEARTBEAT_MS / 1000
SCALA_VERSION = "2.13"

POM_PATH = Path(__file__).resolve().parent / "pom.xml"
_MARKER = ".complete"

# Light JVM flags for a 2-core CI machine. Measured there (median of 3 starts, format + ready, before CDS):
# these 2.8 s, the same with C2 3.3 s, JVM defaults (G1 + C2) 3.5 s.
# - SerialGC: no GC worker threads competing with the proxy and clients for the two cores;
# - TieredStopAtLevel=1 (C1 only): startup and short tests are dominated by JIT warm-up, and C2 compiler threads
#   would steal a core from the proxy under test; peak broker throughput is not what the tests measure;
# - -XX:-UsePerfData: no hsperfdata mmap file in /tmp, slightly faster start.
# SLUICE_KAFKA_JVM_OPTS (space-separated) or KafkaBroker(jvm_opts=...) replace them.
DEFAULT_BROKER_JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# For benches that push the broker hard: full JIT (C2) so the broker is not the bottleneck of a throughput
# ratio; ~0.5 s slower to start.
THROUGHPUT_BROKER_JVM_OPTS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx1g",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)


class RigError(RuntimeError):
    """The rig could not provide a working broker or tool (missing Java, jars, failed start...)."""


# --------------------------------------------------------------------------------------------------------------
# Locating Java and the Kafka jars
# --------------------------------------------------------------------------------------------------------------


def find_java() -> str:
    """Path of the `java` executable: $JAVA_HOME/bin/java, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if not found:
        raise RigError("java not found (set JAVA_HOME or put a Java 17+ `java` on PATH); Kafka 4.x needs Java 17+")
    return found


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition of ``topic`` and its end offset (the offset its next record will get), as the broker reports
    them (ListOffsets, latest): how the benches count what a run stored."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    # The admin client's ListOffsets (it finds each partition's leader itself): a consumer's watermark query answered
    # "Local: Unknown partition" right after a broker was paused and resumed. Right after a resume it can also answer
    # "No leaders found" (_NOENT) or a retriable error (UNKNOWN_LEADER_EPOCH) while its metadata catches up: asked
    # again until answered, within 60 s.
    transient = {KafkaError._NOENT, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.LEADER_NOT_AVAILABLE,
                 KafkaError.NOT_LEADER_FOR_PARTITION}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 60
    while True:
        partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
        asked = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                   request_timeout=30)
        try:
            return {tp.partition: int(future.result(timeout=60).offset) for tp, future in asked.items()}
        except KafkaException as e:
            error = e.args[0]
            if not (error.retriable() or error.code() in transient) or time.monotonic() > deadline:
                raise


#: a record as :func:`read_topic` gives it: (offset, key, value)
StoredRecord = tuple[int, bytes | None, bytes | None]


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> dict[int, list[StoredRecord]]:
    """Every record of ``topic`` up to its end offsets as they are when called, per partition in the order read:
    what the log holds, to compare record by record with what was sent. Read by offset (assigned from the
    beginning until each partition's next offset reaches its end), never by a count that would stop before a
    record stored twice; RigError if the end is not reached within ``timeout``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    ends = end_offsets(bootstrap, topic)
    out: dict[int, list[StoredRecord]] = {p: [] for p in ends}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rig-read-topic", "enable.auto.commit": False,
                         "enable.partition.eof": False})
    next_offset = dict.fromkeys(ends, 0)
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends if ends[p] > 0])
        while any(next_offset[p] < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                raise RigError(f"{topic}: read to {next_offset}, not to its end offsets {ends}, in {timeout:.0f} s")
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                partition, offset = m.partition(), m.offset()
                if m.error() is None and partition is not None and offset is not None and offset < ends[partition]:
                    out[partition].append((offset, m.key(), m.value()))
                    next_offset[partition] = max(next_offset[partition], offset + 1)
    finally:
        consumer.close()
    return out


def cache_root() -> Path:
    """Where downloaded jars live: ${SLUICE_CACHE:-~/.cache/sluice}."""
    return Path(os.environ.get("SLUICE_CACHE") or Path.home() / ".cache" / "sluice").expanduser()


def _has_kafka_jars(libs: Path) -> bool:
    # The broker jar (kafka_<scala>-<v>.jar) and the tools jar are the two the rig runs classes from.
    return libs.is_dir() and any(libs.glob("kafka_*.jar")) and any(libs.glob("kafka-tools-*.jar"))


def _pom_digest() -> str:
    """Hash of what the pom says, not how: XML comments and whitespace do not change the jars."""
    if not POM_PATH.is_file():
        return ""
    text = re.sub(r"<!--.*?-->", "", POM_PATH.read_text(), flags=re.S)
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


def _read_marker(dest: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((dest / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _cache_state(dest: Path) -> str:
    """'missing', 'stale' (fetched by Maven from a pom that has changed since) or 'ok'."""
    marker = _read_marker(dest)
    if marker is None or not _has_kafka_jars(dest / "libs"):
        return "missing"
    # A pom change (e.g. another log4j binding) must reach every machine's cache, so Maven-fetched caches
    # remember which pom produced them. Tarball caches are the official layout and never go stale.
    if marker.get("source") == "maven" and marker.get("pom_sha256") != _pom_digest():
        return "stale"
    return "ok"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock so two processes (parallel `make`, pytest workers) never fetch into the cache at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fetch_with_maven(version: str, libs_out: Path) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise RigError("mvn not found on PATH")
    if not POM_PATH.is_file():
        raise RigError(f"{POM_PATH} is missing")
    cmd = [
        mvn, "-q", "-B", "-f", str(POM_PATH),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs_out}",
        "-DincludeScope=runtime",
        f"-Dkafka.version={version}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise RigError(f"mvn timed out after {exc.timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise RigError(f"mvn exited with {proc.returncode}:\n{tail}")
    if not _has_kafka_jars(libs_out):
        raise RigError(f"mvn succeeded but {libs_out} has no kafka_*.jar / kafka-tools-*.jar")


def _fetch_release_tarball(version: str, libs_out: Path) -> None:
    name = f"kafka_{SCALA_VERSION}-{version}"
    urls = [
        f"https://downloads.apache.org/kafka/{version}/{name}.tgz",
        f"https://archive.apache.org/dist/kafka/{version}/{name}.tgz",
    ]
    errors: list[str] = []
    for url in urls:
        try:
            with tempfile.TemporaryFile() as tmp:
                with urllib.request.urlopen(url, timeout=30) as resp:  # fixed https URLs
                    shutil.copyfileobj(resp, tmp)
                tmp.seek(0)
                libs_out.mkdir(parents=True, exist_ok=True)
                with tarfile.open(fileobj=tmp, mode="r:gz") as tar:
                    # Only regular files directly under <name>/libs/, written by basename: no path traversal.
                    for member in tar.getmembers():
                        parts = member.name.split("/")
                        if member.isfile() and len(parts) == 3 and parts[1] == "libs" and parts[2]:
                            src = tar.extractfile(member)
                            if src is not None:
                                with src, open(libs_out / parts[2], "wb") as out:
                                    shutil.copyfileobj(src, out)
            if _has_kafka_jars(libs_out):
                return
            errors.append(f"{url}: archive has no libs/kafka_*.jar")
        except Exception as exc:  # network errors come in many classes; all mean "try the next source"
            errors.append(f"{url}: {exc}")
    raise RigError("release tarball download failed:\n  " + "\n  ".join(errors))


def fetch_kafka(version: str = KAFKA_VERSION, *, force: bool = False) -> Path:
    """Download the Kafka jars into the cache (Maven first, then the release tarball); return the libs dir.

    Atomic: jars land in a temp dir next to the cache entry, which is renamed into place with its marker only
    once complete, so an interrupted fetch never leaves a half-filled cache that looks usable.
    """
    root = cache_root()
    dest = root / f"kafka-{version}"
    with file_lock(root / f".kafka-{version}.lock"):
        state = _cache_state(dest)
        if state == "ok" and not force:
            return dest / "libs"
        errors: list[str] = []
        for source, fetch in (("maven", _fetch_with_maven), ("tarball", _fetch_release_tarball)):
            tmp = Path(tempfile.mkdtemp(prefix=f".kafka-{version}-", dir=root))
            try:
                print(f"rig: fetching Kafka {version} jars ({source}) into {dest} ...", file=sys.stderr)
                fetch(version, tmp / "libs")
                marker = {"version": version, "source": source, "pom_sha256": _pom_digest(), "time": time.time()}
                (tmp / _MARKER).write_text(json.dumps(marker) + "\n")
                tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared by users
                # Swap by two renames: a JVM started from the old jars meanwhile finds a complete dir either way.
                trash = root / f".kafka-{version}-old-{uuid.uuid4().hex[:8]}"
                if dest.exists():
                    os.rename(dest, trash)
                os.rename(tmp, dest)
                shutil.rmtree(trash, ignore_errors=True)
                return dest / "libs"
            except RigError as exc:
                errors.append(f"{source}: {exc}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        if state == "stale":
            # Offline with a cache from an older pom: a working broker beats a clear error.
            print(f"rig: WARNING: could not refresh {dest}, using the existing jars", file=sys.stderr)
            return dest / "libs"
        raise RigError(
            f"could not get Kafka {version} jars. Set KAFKA_HOME to an unpacked Kafka release, or allow "
            "access to Maven Central / apache.org.\n" + "\n".join(errors)
        )


def find_libs(version: str = KAFKA_VERSION, *, fetch: bool = True) -> Path:
    """The directory of Kafka jars to run (see the module docstring for the search order)."""
    kafka_home = os.environ.get("KAFKA_HOME")
    if kafka_home:
        libs = Path(kafka_home).expanduser() / "libs"
        if not _has_kafka_jars(libs):
            # The user chose this Kafka explicitly: silently using another one would hide the mistake.
            raise RigError(f"KAFKA_HOME={kafka_home} but {libs} has no kafka_*.jar and kafka-tools-*.jar")
        return libs.resolve()
    dest = cache_root() / f"kafka-{version}"
    if _cache_state(dest) == "ok":
        return dest / "libs"
    if not fetch:
        raise RigError(f"Kafka {version} jars are not in {dest}; run `python -m rig.kafka fetch`")
    return fetch_kafka(version)


def classpath(libs_dir: Path) -> str:
    # The JVM expands `dir/*` itself (all jars in dir), which keeps the command line short.
    return f"{libs_dir}/*"


# --------------------------------------------------------------------------------------------------------------
# Faster JVM start: quiet unified logging + AppCDS archives
# --------------------------------------------------------------------------------------------------------------

# JVM unified-logging warnings go to stdout by default, where they would mix with a tool's output (console
# consumer lines); send them to stderr, and silence CDS chatter (e.g. "Pre JDK 6 class not supported by CDS").
JVM_LOG_OPTS: tuple[str, ...] = ("-Xlog:disable", "-Xlog:all=warning:stderr", "-Xlog:cds*=off:stderr")


def _cds_enabled() -> bool:
    return os.environ.get("SLUICE_RIG_CDS", "1") != "0"


def _cds_archive_path(java: str, libs_dir: Path, main_class: str, jvm_opts: Sequence[str]) -> Path:
    """Where the class-data sharing archive for this exact launch configuration lives:
    ``cds/<Main>-<launch key>-<environment key>.jsa``.

    The keys cover everything the JVM checks when it maps the archive: the launch (main class, options) and
    the environment (JDK build, classpath jars), so a JDK upgrade or re-fetched jars get a new archive instead
    of a silently unusable one; `cds_finish` then prunes the launch's archives for older environments.
    """
    real_java = Path(os.path.realpath(java))
    launch: list[object] = [main_class, list(jvm_opts)]
    env: list[object] = [str(real_java), str(libs_dir.resolve())]
    for f in (real_java, real_java.parent.parent / "lib" / "server" / "libjvm.so"):
        with contextlib.suppress(OSError):
            st = f.stat()
            env.append([str(f), st.st_size, st.st_mtime_ns])
    for jar in sorted(libs_dir.glob("*.jar")):
        st = jar.stat()
        env.append([jar.name, st.st_size, st.st_mtime_ns])
    launch_key = hashlib.sha256(json.dumps(launch).encode()).hexdigest()[:12]
    env_key = hashlib.sha256(json.dumps(env).encode()).hexdigest()[:12]
    short = main_class.rsplit(".", 1)[-1]
    return cache_root() / "cds" / f"{short}-{launch_key}-{env_key}.jsa"


def cds_options(
    java: str, libs_dir: Path, main_class: str, jvm_opts: Sequence[str], *, create: bool = True
) -> tuple[list[str], Path | None]:
    """JVM options to use (or create) an AppCDS archive for this launch, and the pending archive to commit.

    Why: most of a Kafka JVM's start is loading and verifying ~5k classes from 90 jars. A dynamic CDS archive
    (JDK 13+) maps them pre-parsed: measured on the 2-core machine, the broker goes from ~2.0 s to ~1.0 s to
    ready, a console producer run from 1.1 s to 0.4 s. The first launch of each kind writes the archive at JVM
    exit (a few seconds extra, once per machine); later launches map it. If the JVM cannot use an archive it
    falls back to normal class loading (-Xshare:auto), so this only ever costs speed. SLUICE_RIG_CDS=0 disables.

    Returns (options, pending): when `pending` is not None the JVM will dump to that temp file; pass it to
    `cds_finish()` after the process exits, which renames it into place only after a clean exit. With
    `create=False` an existing archive is used but none is written (for processes whose exit nobody awaits).
    """
    if not _cds_enabled():
        return [*JVM_LOG_OPTS], None
    try:
        archive = _cds_archive_path(java, libs_dir, main_class, jvm_opts)
        if archive.is_file() and archive.stat().st_size > 0:
            return [*JVM_LOG_OPTS, f"-XX:SharedArchiveFile={archive}"], None
        if not create:
            return [*JVM_LOG_OPTS], None
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return [*JVM_LOG_OPTS], None  # unwritable cache: run without CDS
    pending = archive.with_name(f".{archive.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    return [*JVM_LOG_OPTS, f"-XX:ArchiveClassesAtExit={pending}"], pending


def cds_finish(pending: Path | None, clean_exit: bool) -> None:
    """Move a freshly dumped archive into place (atomic rename), or drop it if the JVM did not exit cleanly."""
    if pending is None:
        return
    final = pending.with_name(pending.name[1:].split(".jsa.", 1)[0] + ".jsa")
    try:
        if clean_exit and pending.is_file() and pending.stat().st_size > 0:
            os.replace(pending, final)
            # Archives of the same launch for an older JDK/jar set (~25-50 MB each) will never map again.
            launch_prefix = final.name.rsplit("-", 1)[0] + "-"
            for old in final.parent.glob(f"{launch_prefix}*.jsa"):
                if old != final:
                    old.unlink(missing_ok=True)
        else:
            pending.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            pending.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------------------


#: Linux's range for ports the kernel hands out by itself (an outgoing connection's local port, a bind to port 0)
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


#: SLUICE_PORT_RANGE="LOW-HIGH" (inclusive): the ports this process's rig picks from. Sessions that run side by side
#: (`make test`'s two pytest sessions and the oldest-Kafka subset in `.ci/run`) each get a range of their own, so a
#: port one session picked and has not bound yet can never be bound by another (seen: a cluster's sidecar refused
#: its bootstrap port with EADDRINUSE when the other session's cluster started in the same seconds).
PORT_RANGE_ENV = "SLUICE_PORT_RANGE"


def listen_port_range() -> range:
    """Ports below the kernel's ephemeral range, or the session's own part of them (PORT_RANGE_ENV). A port picked
    for a listener that starts later (a broker, a sidecar that binds once the brokers serve) is free when picked but
    not reserved: picked from the ephemeral range, any connect() meanwhile may take it as its local port, and the
    listener then cannot bind it (seen: a cluster's replication sidecar whose broker port was taken, every follower
    of that leader out of the ISR)."""
    own = os.environ.get(PORT_RANGE_ENV)
    if own:
        try:
            low_s, high_s = own.split("-")
            low, high = int(low_s), int(high_s)
        except ValueError as e:
            raise RigError(f"{PORT_RANGE_ENV}={own!r}: expected LOW-HIGH, e.g. 10000-17999") from e
        if not 1024 <= low < high <= 65535:
            raise RigError(f"{PORT_RANGE_ENV}={own!r}: expected 1024 <= LOW < HIGH <= 65535")
        return range(low, high + 1)
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(10_000, low) if low - 10_000 >= 4_096 else range(0)


#: ports this process handed out lately: free when picked, bound only later (a cluster picks its sidecars' ports
#: before it starts the brokers that name them, and then the brokers' own), so a later pick must not hand one out
#: again (seen: a sidecar that could not bind the port a broker had been given since)
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=512)


#: the highest broker node id a rig cluster has (rig/cluster.py numbers its brokers 1..N; the rig's clusters have 3):
#: a Sluice in front of one serves node N on broker_port_base + N, so the rig picks base + 1 .. base + this all free
RIG_NODE_IDS = 3


def free_ports(count: int, host: str = "127.0.0.1", *, consecutive: bool = False) -> list[int]:
    """`count` distinct TCP ports free to listen on, below the ephemeral range when the machine leaves room (else
    picked by the kernel), none handed out by this process lately; all sockets held open until all are picked.
    ``consecutive``: a run of ports (start, start + 1, ...), for a Sluice that serves broker node N on
    broker_port_base + N: each node's port must be free, not only the first node's."""
    socks: list[socket.socket] = []
    candidates = listen_port_range()
    if consecutive:
        # the kernel picks single ports only: a run's start is picked here, from a range that leaves room for it
        pool = candidates or range(1024, 65536)
        candidates = pool[: len(pool) - count + 1]
    try:
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if consecutive and socks:
                port = socks[-1].getsockname()[1] + 1
            else:
                port = secrets.choice(candidates) if candidates else 0
            try:
                s.bind((host, port))
            except OSError:
                s.close()  # taken (a listener, a socket in TIME_WAIT): another pick
                if consecutive:
                    _close_all(socks)  # the run is broken: a new one from another start
                continue
            if candidates and s.getsockname()[1] in _HANDED_OUT:
                s.close()  # free now, but given to a listener that binds later: another pick
                if consecutive:
                    _close_all(socks)
                continue
            socks.append(s)
        ports = [s.getsockname()[1] for s in socks]
        _HANDED_OUT.extend(ports)
        return ports
    finally:
        _close_all(socks)


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()
    socks.clear()


def random_cluster_id() -> str:
    """A Kafka Uuid string (base64url, no padding), as `kafka-storage random-uuid` prints."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        # Kafka's Uuid.randomUuid() rejects ids starting with '-' (they look like CLI flags); so do we.
        if not cid.startswith("-"):
            return cid


# libc's prctl, looked up once in the parent: the child of fork() should do as little as possible before exec
# (another thread may have held the dynamic loader's lock at fork time, so no dlopen() there).
try:
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not glibc/Linux: no parent-death signal, atexit still applies
    _PRCTL = None
_PR_SET_PDEATHSIG = 1


def set_pdeathsig() -> None:
    """preexec_fn for subprocesses: ask Linux to SIGTERM the child when its parent dies.

    atexit does not run when the Python process is SIGKILLed (OOM killer, CI timeout); this still stops the
    JVM then, so none outlives the test run. Note it fires when the *thread* that forked exits, so callers only
    use it from the main thread.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def main_thread_pdeathsig() -> Callable[[], None] | None:
    """`set_pdeathsig` when called from the main thread (see its caveat), else None."""
    return set_pdeathsig if threading.current_thread() is threading.main_thread() else None


def tail_file(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file (reads at most its last 256 KiB); '' if unreadable."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """One Metadata round trip over a raw socket; returns the (node_id, host, port) the broker advertises.

    Metadata v4 on purpose: Kafka 4.0 removed Metadata v0-v3 (KIP-896), and v4 is the oldest version left,
    non-flexible (no tagged fields), so it is a dozen lines of struct. A broker lists itself here only once it
    has registered with the controller and been unfenced, i.e. when it can serve produce/fetch.
    """
    client_id = b"sluice-rig"
    # request header v1: api_key=3 (Metadata), api_version=4, correlation_id, client_id (int16-length string)
    header = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id
    # body v4: topics = empty array (no topics: cheapest), allow_auto_topic_creation = false
    body = struct.pack(">i?", 0, False)
    frame = header + body
    from rig.raw import recv_exact  # here: `python -m rig.kafka fetch` needs nothing beyond the standard library

    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", recv_exact(sock, 4))
        resp = recv_exact(sock, size)
    # response header v0: correlation_id; body v4: throttle_time_ms, brokers[node_id, host, port, rack?], ...
    correlation_id, _throttle, count = struct.unpack_from(">iii", resp, 0)
    if correlation_id != 1:
        raise ValueError(f"unexpected correlation id {correlation_id}")
    pos = 12
    brokers: list[tuple[int, str, int]] = []
    for _ in range(count):
        (node_id, hlen) = struct.unpack_from(">ih", resp, pos)
        pos += 6
        bhost = resp[pos : pos + hlen].decode()
        pos += hlen
        (bport, rlen) = struct.unpack_from(">ih", resp, pos)
        pos += 6 + max(rlen, 0)
        brokers.append((node_id, bhost, bport))
    return brokers


# --------------------------------------------------------------------------------------------------------------
# The broker
# --------------------------------------------------------------------------------------------------------------

# Brokers constructed and not yet closed; atexit closes them (stops the JVM, removes the temp dir) so an
# interrupted test run, or a start that failed before any fixture owned the broker, leaks neither.
_OPEN: set[KafkaBroker] = set()
_OPEN_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _OPEN_LOCK:
        brokers = list(_OPEN)
    for broker in brokers:
        with contextlib.suppress(Exception):
            broker.close()


atexit.register(_stop_all_at_exit)

_LOG4J2_BROKER = """\
# Written by rig/kafka.py: the broker logs to one file in its temp dir, nothing on the console.
status = error
name = sluice-rig-broker
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_path}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
# Chatty below INFO-worthy: per-connection client logs, state-change traces, the request logger.
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
"""


class KafkaBroker:
    """One real Kafka 4.x node (KRaft, combined broker + controller) on 127.0.0.1.

    >>> with KafkaBroker() as broker:        # formats storage, starts, waits until it serves Metadata
    ...     use(broker.bootstrap)            # "127.0.0.1:PORT"
    ...     broker.restart()                 # same ports, same data

    Ports are chosen at construction (or given) and kept across restarts, so clients and a proxy in front can
    reconnect to the same address. The temp dir (config, data, logs) lives until `close()`.
    """

    def __init__(
        self,
        *,
        libs_dir: Path | str | None = None,
        node_id: int = 1,
        port: int | None = None,
        controller_port: int | None = None,
        work_dir: Path | str | None = None,
        overrides: Mapping[str, str | int | float | bool | None] | None = None,
        jvm_opts: Sequence[str] | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 30.0,
        keep_work_dir: bool | None = None,
        process_roles: str = "broker,controller",
        cluster_id: str | None = None,
        controller_voters: str | None = None,
    ) -> None:
        self._libs_dir = Path(libs_dir).resolve() if libs_dir is not None else find_libs()
        self._java = find_java()
        self._node_id = node_id
        # Auto-picked ports may be taken by someone else between picking and binding: only then is a retry with
        # fresh ports allowed (see start()).
        self._auto_ports = port is None and controller_port is None
        if port is None or controller_port is None:
            picked = free_ports(2)
            port = port if port is not None else picked[0]
            controller_port = controller_port if controller_port is not None else picked[1]
        self._port = port
        self._controller_port = controller_port
        self._owns_work_dir = work_dir is None
        self._work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="sluice-kafka-"))
        self._work_dir.mkdir(parents=True, exist_ok=True)
        self._overrides = dict(overrides or {})
        env_opts = os.environ.get("SLUICE_KAFKA_JVM_OPTS")
        if jvm_opts is not None:
            self._jvm_opts = list(jvm_opts)
        elif env_opts:
            self._jvm_opts = env_opts.split()
        else:
            self._jvm_opts = list(DEFAULT_BROKER_JVM_OPTS)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._keep_work_dir = (
            keep_work_dir if keep_work_dir is not None else os.environ.get("SLUICE_KEEP_KAFKA_DIR") == "1"
        )
        # A node of a cluster (rig/cluster.py) shares the cluster's id and voters and has one role; alone, it is
        # both broker and its own single controller.
        if process_roles not in ("broker,controller", "broker", "controller"):
            raise RigError(f"process_roles {process_roles!r}: broker,controller | broker | controller")
        if process_roles != "broker,controller" and not controller_voters:
            raise RigError("a broker-only or controller-only node needs controller_voters")
        self._roles = process_roles
        self._voters = controller_voters or f"{node_id}@127.0.0.1:{self._controller_port}"
        self._cluster_id = cluster_id or random_cluster_id()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdout: IO[bytes] | None = None
        # A CDS archive this JVM writes at exit; kept only if it exits by itself or on SIGTERM (see stop()).
        self._cds_pending: Path | None = None
        self._formatted = (self.data_dir / "meta.properties").exists()
        self._closed = False
        self._log_offset = 0
        with _OPEN_LOCK:
            _OPEN.add(self)
        #: seconds the last start() took (storage format + JVM start + readiness), for benches and reports
        self.last_start_seconds: float | None = None

    # ---- properties --------------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self._port

    @property
    def controller_port(self) -> int:
        return self._controller_port

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self._port}"

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def libs_dir(self) -> Path:
        return self._libs_dir

    @property
    def work_dir(self) -> Path:
        return self._work_dir

    @property
    def data_dir(self) -> Path:
        return self._work_dir / "data"

    @property
    def config_path(self) -> Path:
        return self._work_dir / "server.properties"

    @property
    def log_path(self) -> Path:
        """The broker's log4j2 log (the JVM's own stdout/stderr go to `stdout_path`)."""
        return self._work_dir / "broker.log"

    @property
    def stdout_path(self) -> Path:
        return self._work_dir / "stdout.log"

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ---- configuration -----------------------------------------------------------------------------------

    @property
    def process_roles(self) -> str:
        return self._roles

    def server_properties(self) -> dict[str, str]:
        """The broker config, overrides applied last (an override of None removes the key)."""
        p, c = self._port, self._controller_port
        if self._roles == "controller":
            # A dedicated controller (rig/cluster.py): the CONTROLLER listener only, none of the broker's settings.
            props: dict[str, Any] = {
                "process.roles": "controller",
                "node.id": self._node_id,
                "controller.quorum.voters": self._voters,
                "listeners": f"CONTROLLER://127.0.0.1:{c}",
                "controller.listener.names": "CONTROLLER",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
                "log.dirs": str(self.data_dir),
                # broker.session.timeout.ms stays Kafka's (9 s): after a kill -9, leaders move once it has passed;
                # shorter, a starved machine's stall fences live brokers (server_properties' single node, below)
                "num.network.threads": 1,
                "num.io.threads": 2,
            }
            return self._apply_overrides(props)
        listeners = f"PLAINTEXT://127.0.0.1:{p}"
        if self._roles == "broker,controller":
            listeners += f",CONTROLLER://127.0.0.1:{c}"
        props = {
            "process.roles": self._roles,
            "node.id": self._node_id,
            # A static voter set (KIP-595) rather than controller.quorum.bootstrap.servers + `format --standalone`
            # (KIP-853): both work in 4.1, but with static voters the formatted data dir holds no controller
            # endpoint, so nothing in it depends on the port.
            "controller.quorum.voters": self._voters,
            "listeners": listeners,
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{p}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # Single node: every internal topic must fit on one replica, or groups/transactions/share groups
            # never get a coordinator (defaults are 3 replicas, min ISR 2).
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            # Fewer internal partitions than the default 50: creating __consumer_offsets on the first group
            # join is otherwise the slowest step of a fresh broker's first test.
            "offsets.topic.num.partitions": 5,
            "transaction.state.log.num.partitions": 5,
            "share.coordinator.state.topic.num.partitions": 5,
            # Tests join groups all the time; the default 3 s wait for more members would dominate them.
            "group.initial.rebalance.delay.ms": 0,
            # KIP-848 consumer groups and KIP-932 share groups are timed by the broker, not the client: a member
            # heartbeats at the broker's interval (5 s by default, and no less than its minimum, also 5 s) and
            # is fenced after the broker's session timeout (45 s, minimum 45 s). A reconciliation moves a partition
            # over two heartbeats, and a killed member's partitions wait out the session: at the defaults every
            # group test waited tens of seconds on the clock. The same ratio (session = 10 heartbeats) as the
            # classic members the tests start (heartbeat.interval.ms=500, session.timeout.ms=6000).
            "group.consumer.heartbeat.interval.ms": GROUP_HEARTBEAT_MS,
            "group.consumer.min.heartbeat.interval.ms": GROUP_HEARTBEAT_MS,
            "group.consumer.session.timeout.ms": GROUP_SESSION_MS,
            "group.consumer.min.session.timeout.ms": GROUP_SESSION_MS,
            "group.share.heartbeat.interval.ms": GROUP_HEARTBEAT_MS,
            "group.share.min.heartbeat.interval.ms": GROUP_HEARTBEAT_MS,
            "group.share.session.timeout.ms": GROUP_SESSION_MS,
            "group.share.min.session.timeout.ms": GROUP_SESSION_MS,
            "num.partitions": 1,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            # broker.heartbeat.interval.ms and broker.session.timeout.ms stay Kafka's (2 s, 9 s), though a node
            # restarted after a crash (kill()) cannot register until the dead incarnation's session expired. 4 s
            # (heartbeat 1 s) made such restarts faster, and the controller then fenced its own live broker on this
            # 2-core machine under load (eight times in 3.5 minutes, 1 Dec 2026: "Fencing broker 1 ... because its
            # session has timed out"): Metadata named no broker, FindCoordinator said COORDINATOR_NOT_AVAILABLE,
            # and librdkafka dropped every broker it knew and waited minutes for its re-bootstrap.
            # The log cleaner looks for work every 15 s when it found none (log.cleaner.backoff.ms): a compacted
            # topic's test (the fleet's control topic) would wait on that clock. Its checks are cheap.
            "log.cleaner.backoff.ms": 500,
            # Two cores: fewer threads than the defaults (3 network, 8 I/O, 1 recovery) keeps the JVM light.
            "num.network.threads": 2,
            "num.io.threads": 4,
        }
        return self._apply_overrides(props)

    def _apply_overrides(self, props: dict[str, Any]) -> dict[str, str]:
        for key, value in self._overrides.items():
            if value is None:
                props.pop(key, None)
            else:
                props[key] = value
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in props.items()}

    def _write_config(self) -> None:
        lines = ["# Written by rig/kafka.py"]
        lines += [f"{k}={v}" for k, v in self.server_properties().items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        log4j = self._work_dir / "log4j2.properties"
        # log4j2 properties treat backslashes as escapes; temp paths never contain them on Linux.
        log4j.write_text(_LOG4J2_BROKER.format(log_path=self.log_path))

    def _format_storage(self) -> None:
        main = "kafka.tools.StorageTool"
        opts = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]
        cds, pending = cds_options(self._java, self._libs_dir, main, opts)
        cmd = [
            self._java, *opts, *cds,
            f"-Dlog4j2.configurationFile={self._work_dir / 'log4j2.properties'}",
            "-cp", classpath(self._libs_dir),
            main, "format",
            "--cluster-id", self._cluster_id,
            "--config", str(self.config_path),
        ]  # fmt: skip
        try:
            # A hang guard: a format that writes its class-data archive (the first on a machine, cds_options) at
            # nice 19 beside CI's test sessions took over 120 s.
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            cds_finish(pending, clean_exit=False)
            raise RigError(f"kafka storage format timed out after {exc.timeout:.0f}s") from exc
        cds_finish(pending, clean_exit=proc.returncode == 0)
        if proc.returncode != 0:
            raise RigError(f"kafka storage format failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        self._formatted = True

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> KafkaBroker:
        """Format storage (first start only), start the JVM, and return once the broker serves Metadata."""
        if self._closed:
            raise RigError("this KafkaBroker was closed")
        if self.is_running:
            return self
        t0 = time.monotonic()
        attempts = 3 if (self._auto_ports and not self._formatted) else 1
        for attempt in range(1, attempts + 1):
            self._write_config()
            if not self._formatted:
                self._format_storage()
            try:
                self._spawn()
                self._wait_ready(time.monotonic() + self.startup_timeout)
                break
            except RigError:
                self._kill_now()
                port_taken = "failed to bind" in self._log_since_spawn()
                if attempt < attempts and port_taken:
                    # Someone took a port we picked: fresh ports, fresh (port-independent but maybe half-written)
                    # storage, and try again.
                    self._port, self._controller_port = free_ports(2)
                    shutil.rmtree(self.data_dir, ignore_errors=True)
                    self._formatted = False
                    continue
                raise
        self.last_start_seconds = time.monotonic() - t0
        return self

    def _spawn(self) -> None:
        cds, self._cds_pending = cds_options(self._java, self._libs_dir, "kafka.Kafka", self._jvm_opts)
        cmd = [
            self._java,
            *self._jvm_opts,
            *cds,
            f"-Dlog4j2.configurationFile={self._work_dir / 'log4j2.properties'}",
            "-cp", classpath(self._libs_dir),
            "kafka.Kafka", str(self.config_path),
        ]  # fmt: skip
        # Where this run's log starts: the log is appended to across restarts, errors are reported per run.
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._stdout = open(self.stdout_path, "ab")  # closed in _reap()
        self._proc = subprocess.Popen(
            cmd,
            cwd=self._work_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            # Own process group: a Ctrl-C in the terminal reaches Python, which then stops the broker in
            # order (and the proxy before it), instead of every JVM receiving SIGINT at once.
            start_new_session=True,
            preexec_fn=main_thread_pdeathsig(),
        )

    def _wait_ready(self, deadline: float) -> None:
        last_error = "no answer yet"
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise RigError(f"Kafka broker exited with code {code} during startup\n{self.log_tail()}")
            try:
                if self._roles == "controller":
                    # A controller serves no Metadata to clients; it is up once its listener accepts (the brokers'
                    # own readiness, registered and unfenced, proves the quorum works).
                    with socket.create_connection((self.host, self._controller_port), timeout=2.0):
                        return
                brokers = metadata_brokers(self.host, self._port, timeout=2.0)
                if any(b[0] == self._node_id and b[2] == self._port for b in brokers):
                    return
                last_error = f"Metadata lists brokers {brokers}, not node {self._node_id} yet"
            except (OSError, ValueError, struct.error) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise RigError(
                    f"Kafka broker not ready after {self.startup_timeout:.0f}s ({last_error})\n{self.log_tail()}"
                )
            # Poll interval for the readiness condition above (not a synchronisation sleep).
            time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the broker: SIGTERM (controlled shutdown), wait, then SIGKILL. Keeps the data for restart()."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGCONT)  # a paused broker (pause()) handles SIGTERM only once running
            try:
                proc.wait(timeout=self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self._kill_now()
        # Exited on SIGTERM (143) or by itself after a normal start: the JVM's exit path wrote the archive.
        self._reap(clean_exit=proc.returncode in (0, 143, -signal.SIGTERM))

    def kill(self) -> None:
        """Crash the broker (SIGKILL, no controlled shutdown); restart() then runs log recovery."""
        self._kill_now()

    def _kill_now(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
        self._reap()

    def _reap(self, clean_exit: bool = False) -> None:
        if self._proc is None or self._proc.poll() is not None:
            cds_finish(self._cds_pending, clean_exit)
            self._cds_pending = None
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): its sockets stay open and connects still complete in the kernel's backlog,
        but nothing is read or answered, as with a long GC pause or a stalled VM. `resume()` undoes it."""
        self._signal_running(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused broker run again (SIGCONT)."""
        self._signal_running(signal.SIGCONT)

    def _signal_running(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RigError(f"the broker is not running (cannot send {sig.name})")
        self._proc.send_signal(sig)

    def restart(self, *, hard: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL when `hard`) and start again on the same ports with the same data."""
        if hard:
            self.kill()
        else:
            self.stop()
        self.start()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the broker process to exit; its exit code, or None if still running after `timeout`."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Stop the broker and delete its temp dir (unless it was given, or SLUICE_KEEP_KAFKA_DIR=1)."""
        self.stop()
        if not self._closed and self._owns_work_dir and not self._keep_work_dir:
            shutil.rmtree(self._work_dir, ignore_errors=True)
        self._closed = True
        with _OPEN_LOCK:
            _OPEN.discard(self)

    def _log_since_spawn(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                return fh.read(8 * 1024 * 1024).decode("utf-8", "replace")
        except OSError:
            return ""

    def log_errors(self, limit: int = 10) -> str:
        """ERROR/FATAL events of the current (or last) run, each with the two lines after it (the exception).

        A failed start logs its cause once and then hundreds of shutdown lines; the tail alone misses it.
        """
        lines = self._log_since_spawn().splitlines()
        picked: list[str] = []
        events = 0
        for i, line in enumerate(lines):
            if "] ERROR " in line or "] FATAL " in line:
                picked += lines[i : i + 3]
                events += 1
                if events >= limit:
                    break
        return "\n".join(picked)

    def log_tail(self, lines: int = 40) -> str:
        """For error messages: this run's ERROR events, then the last lines of the broker log and JVM output."""
        parts = []
        errors = self.log_errors()
        if errors:
            parts.append(f"--- errors in {self.log_path} ---\n{errors}")
        for path in (self.log_path, self.stdout_path):
            text = tail_file(path, lines)
            if text.strip():
                parts.append(f"--- {path} (last {lines} lines) ---\n{text}")
        return "\n".join(parts) or f"(no broker output in {self._work_dir})"

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<KafkaBroker node {self._node_id} {self.bootstrap} {state} dir={self._work_dir}>"


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------


def _raise_system_exit(signum: int, _frame: object) -> None:
    # SIGTERM -> SystemExit so `finally` blocks and atexit stop the broker.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.kafka", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="make sure the Kafka jars are present; print the libs dir")
    p_fetch.add_argument("--force", action="store_true", help="download again even if cached")
    p_fetch.add_argument("--all", action="store_true", help=f"every release the rig runs ({', '.join(KAFKA_VERSIONS)})")
    p_start = sub.add_parser("start", help="start a broker, print its bootstrap address, run until Ctrl-C")
    p_start.add_argument("--port", type=int, default=None, help="broker listener port (default: a free one)")
    p_start.add_argument("--keep", action="store_true", help="keep the broker's temp dir after exit")
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            versions = sorted(set(KAFKA_VERSIONS) | {KAFKA_VERSION}) if args.all else [KAFKA_VERSION]
            for version in versions:
                libs = fetch_kafka(version, force=True) if args.force else find_libs(version)
                print(libs)
            if not os.environ.get("KAFKA_HOME"):
                # A cache fetched from Maven must still be usable by the JVM; check Java is there too.
                find_java()
            return 0
        # Ctrl-C -> KeyboardInterrupt even if a non-interactive shell started us with SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_system_exit)
        broker = KafkaBroker(port=args.port, keep_work_dir=args.keep or None)
        try:
            broker.start()
            print(f"Kafka {KAFKA_VERSION} broker ready in {broker.last_start_seconds:.1f}s", flush=True)
            print(f"  bootstrap: {broker.bootstrap}", flush=True)
            print(f"  log:       {broker.log_path}", flush=True)
            print("Ctrl-C to stop.", flush=True)
            code = broker.wait()
            print(f"broker exited with code {code}\n{broker.log_tail()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            broker.close()
    except RigError as exc:
        print(f"rig: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
