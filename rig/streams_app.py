"""A real Kafka Streams application (Kafka's own kafka-streams jar) for tests: rig/streams/WordCount.java.

Kafka Streams is a library, not a tool of the distribution, so the rig compiles a small application against it:
the word count of Kafka's Streams documentation (input values split into words, counted per word into an output
topic), exactly-once (``exactly_once_v2``), with the group protocol it is given: ``classic`` (the consumer group
rebalance protocol) or ``streams`` (KIP-1071's streams groups, StreamsGroupHeartbeat; a release whose broker does
not enable them refuses to start it).

Jars: kafka-streams of the broker's release (the rig's libs dir names it: :func:`rig.java_tools.libs_version`),
fetched once by ``mvn dependency:copy-dependencies`` over rig/streams/pom.xml into
``<cache>/streams-<version>/libs`` (its own directory: the broker's cache and its pom stay as they are). The
class is compiled with ``javac`` into ``<cache>/streams-<version>/classes-<source digest>``, once per source.
Both under a file lock, so parallel sessions do it once.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from rig.java_tools import FAST_JVM_OPTS, JavaTools, libs_version
from rig.kafka import RigError, cache_root, classpath, file_lock, find_java, main_thread_pdeathsig

SOURCE = Path(__file__).resolve().parent / "streams" / "WordCount.java"
POM = Path(__file__).resolve().parent / "streams" / "pom.xml"
MAIN_CLASS = "WordCount"


def _version_text(libs_dir: Path) -> str:
    return ".".join(str(d) for d in libs_version(libs_dir))


def streams_libs(version: str) -> Path:
    """The kafka-streams jars of ``version`` (and their dependencies but kafka-clients), fetched once."""
    root = cache_root() / f"streams-{version}"
    libs = root / "libs"
    with file_lock(cache_root() / f".streams-{version}.lock"):
        if any(libs.glob("kafka-streams-*.jar")):
            return libs
        mvn = shutil.which("mvn")
        if not mvn:
            raise RigError("mvn not found on PATH (needed once, for the kafka-streams jars)")
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".libs-", dir=root))
        try:
            proc = subprocess.run(
                [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", f"-DoutputDirectory={tmp}",
                 "-DincludeScope=runtime", f"-Dkafka.version={version}"],
                capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
            if proc.returncode != 0 or not any(tmp.glob("kafka-streams-*.jar")):
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
                raise RigError(f"fetching kafka-streams {version} failed ({proc.returncode}):\n{tail}")
            tmp.rename(libs)  # complete, or not there at all
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return libs


def compiled_classes(broker_libs: Path, streams: Path, version: str) -> Path:
    """WordCount compiled against these jars (once per source and release)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    out = cache_root() / f"streams-{version}" / f"classes-{digest}"
    with file_lock(cache_root() / f".streams-{version}.lock"):
        if (out / f"{MAIN_CLASS}.class").is_file():
            return out
        javac = shutil.which("javac", path=str(Path(find_java()).resolve().parent)) or shutil.which("javac")
        if not javac:
            raise RigError("javac not found (a JDK is needed to compile the rig's Streams application)")
        tmp = Path(tempfile.mkdtemp(prefix=".classes-", dir=out.parent))
        try:
            proc = subprocess.run(
                [javac, "-nowarn", "-d", str(tmp), "-cp", f"{classpath(broker_libs)}:{classpath(streams)}",
                 str(SOURCE)], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise RigError(f"javac {SOURCE.name} failed:\n{proc.stdout}{proc.stderr}")
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


class WordCountApp:
    """Builds the application's command line; :meth:`spawn` starts one instance (the caller stops it)."""

    def __init__(self, tools: JavaTools) -> None:
        self.tools = tools
        self.version = _version_text(tools.libs_dir)
        self.streams_libs = streams_libs(self.version)
        self.classes = compiled_classes(tools.libs_dir, self.streams_libs, self.version)

    def command(self, bootstrap: str, app_id: str, source: str, sink: str, protocol: str, state_dir: Path,
                log4j_config: Path) -> list[str]:
        cp = f"{self.classes}:{classpath(self.tools.libs_dir)}:{classpath(self.streams_libs)}"
        return [self.tools.java, *FAST_JVM_OPTS, f"-Dlog4j2.configurationFile={log4j_config}", "-cp", cp,
                MAIN_CLASS, bootstrap, app_id, source, sink, protocol, str(state_dir)]

    def spawn(self, bootstrap: str, app_id: str, source: str, sink: str, protocol: str,
              state_dir: Path) -> subprocess.Popen[str]:
        """One instance, its stdout the state changes (``STATE RUNNING``...), its stderr Kafka's warnings."""
        return subprocess.Popen(
            self.command(bootstrap, app_id, source, sink, protocol, state_dir, self.tools.log4j_config),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=main_thread_pdeathsig())
