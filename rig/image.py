"""`make test-image`: Sluice's container image and the docker-compose rig, built and run with Podman, checked from
the host as a user would use them.

Steps, each timed; any failure stops the run with a message saying what failed (never a skip):

1. Host tools. Podman runs as root here (rootless Podman needs subordinate uid ranges this target does not set
   up). Missing Debian packages are installed with apt-get: podman, runc (crun 1.8 refuses hybrid cgroups),
   netavark + aardvark-dns (compose networks with DNS by service name), iptables (published ports), mmdebstrap
   (base images without a registry). podman-compose comes from PyPI into a tool venv in the cache.
2. Podman's configuration, written into ``$SLUICE_CACHE/podman`` (default ``~/.cache/sluice/podman``) and exported
   to every podman call (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF): runtime runc,
   cgroupfs, the file events logger, explicit ulimits (the defaults need CAP_SYS_RESOURCE), overlay storage in
   the cache, so images are kept between runs and nothing touches /var/lib/containers.
3. Base images: each image the Dockerfile and docker-compose.yml name (python:3.11-slim, apache/kafka,
   prom/prometheus) is used when present locally, pulled when a registry answers, and otherwise replaced by a
   local stand-in (rig/standins/: Debian packages via mmdebstrap, the Kafka jars the rig fetches from Maven
   Central) tagged with the official name, so ``--pull=never`` resolves it. Stand-ins are rebuilt only when their
   recipe changes (a label holds its digest); a cached stand-in is not trusted forever: each run probes the
   registry once (bounded, ``REGISTRY_PROBE_TIMEOUT_S``) and pulls the real image when it answers. The run's last
   lines say which base images were real and which stand-ins.
4. The Sluice image: ``podman build --format docker --pull=never`` (the docker format keeps HEALTHCHECK).
5. docker-compose.yml up with podman-compose: Kafka (the rig's default release, checked first), Sluice,
   Prometheus, and the sidecar example (app + app-sidecar in app's network namespace) (``TESTED_SERVICES``; not
   Grafana).
6. Checks, from the host: /readyz is 200; kafka-python produces records through Sluice (bootstrap
   localhost:19092, the broker listener it advertises) and a consumer group reads every one once, in order; the
   image's HEALTHCHECK passes (``podman healthcheck run``); Prometheus's API shows the sluice target up and
   sluice_* series scraped from it; the example application consumed all its records through its sidecar.
7. The rig down (also on failure, after printing each container's last log lines), then the Helm chart's pod run
   with ``podman kube play`` and stopped mid-way (rig/kube_pod.py).

Usage: ``python -m rig.image [--keep-up]`` (``make test-image``). Exit code 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rig.kafka import RigError, cache_root, file_lock, find_libs
from rig.kafka_python_group import wait_partitions_known

REPO = Path(__file__).resolve().parent.parent
STANDINS = Path(__file__).resolve().parent / "standins"
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
PROJECT = "sluice-test-image"  # the compose project: container, network and pod names
SLUICE_IMAGE = "sluice:latest"  # docker-compose.yml's `image:` for the built service
PODMAN_COMPOSE_VERSION = "1.6.0"
DEBIAN_SUITE = "bookworm"
DEBIAN_BASE = f"localhost/sluice-standin/debian:{DEBIAN_SUITE}"
LABEL = "dev.sluice.standin"  # the stand-in recipe's digest, so a changed recipe is rebuilt

# Debian packages the target needs on the host: {command or file that proves it is there: package}
HOST_PACKAGES = {
    "podman": "podman",
    "runc": "runc",
    "/usr/lib/podman/netavark": "netavark",
    "/usr/lib/podman/aardvark-dns": "aardvark-dns",
    "iptables": "iptables",
    "mmdebstrap": "mmdebstrap",
    "catatonit": "catatonit",  # podman kube play builds its pause image with it (rig/kube_pod.py)
}
# What docker-compose.yml publishes on the host (Sluice's bootstrap and node-1 listeners, its admin port, Prometheus)
BOOTSTRAP = "localhost:19092"
ADMIN_URL = "http://127.0.0.1:9644"
PROMETHEUS_URL = "http://127.0.0.1:9090"
HOST_PORTS = (19092, 19094, 9644, 9090)
RECORDS = 1000


class ImageTestError(RuntimeError):
    """A step failed; the message says which and why."""


# ---------------------------------------------------------------------------------------------------- steps


@dataclass
class Timings:
    started: float
    steps: list[tuple[str, float]]

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(f"\n== {name}", flush=True)
        t0 = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - t0
            self.steps.append((name, took))
            print(f"== {name}: {took:.1f}s", flush=True)

    def summary(self) -> str:
        lines = [f"  {took:6.1f}s  {name}" for name, took in self.steps]
        lines.append(f"  {time.monotonic() - self.started:6.1f}s  total")
        return "\n".join(lines)


def run(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 1800, capture: bool = False,
        check: bool = True, cwd: Path | None = None, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a command, echoed first; output goes to our stdout unless captured. Failure -> ImageTestError."""
    if not quiet:
        print("$ " + " ".join(cmd), flush=True)
    try:
        proc = subprocess.run(
            list(cmd), env=dict(env) if env is not None else None, cwd=cwd, timeout=timeout, text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None,
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageTestError(f"`{' '.join(cmd)}` did not finish in {timeout:.0f}s") from exc
    except FileNotFoundError as exc:
        raise ImageTestError(f"`{cmd[0]}` not found: {exc}") from exc
    if check and proc.returncode != 0:
        detail = f"\n{proc.stdout or ''}{proc.stderr or ''}".rstrip() if capture else ""
        raise ImageTestError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}{detail}")
    return proc


# ------------------------------------------------------------------------------------------------ host tools


def ensure_root() -> None:
    if os.geteuid() != 0:
        raise ImageTestError(
            "make test-image runs Podman as root (rootless Podman needs subordinate uid/gid ranges and user "
            "namespaces, which this target does not set up): run it as root, e.g. `sudo make test-image`"
        )


def _present(probe: str) -> bool:
    return Path(probe).exists() if probe.startswith("/") else shutil.which(probe) is not None


def ensure_host_packages() -> None:
    missing = sorted({pkg for probe, pkg in HOST_PACKAGES.items() if not _present(probe)})
    if not missing:
        print("host packages present: " + " ".join(sorted(set(HOST_PACKAGES.values()))))
        return
    if shutil.which("apt-get") is None:
        raise ImageTestError(f"missing {', '.join(missing)} and no apt-get on this machine: install them first")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-q"], env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)
    still = [pkg for probe, pkg in HOST_PACKAGES.items() if not _present(probe)]
    if still:
        raise ImageTestError(f"apt-get installed, yet still missing: {', '.join(still)}")


def ensure_podman_compose(state: Path) -> Path:
    """podman-compose in its own venv in the cache (not the project's venv: it is a tool, not a dependency)."""
    venv = state / "tools" / f"podman-compose-{PODMAN_COMPOSE_VERSION}"
    exe = venv / "bin" / "podman-compose"
    if exe.exists():
        print(f"podman-compose {PODMAN_COMPOSE_VERSION}: {exe}")
        return exe
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"podman-compose=={PODMAN_COMPOSE_VERSION}"])
    if not exe.exists():
        raise ImageTestError(f"pip installed podman-compose, but {exe} does not exist")
    return exe


# ------------------------------------------------------------------------------------------ podman's settings

CONTAINERS_CONF = """\
# Written by rig/image.py (make test-image); what works on these machines (docs/deployment.md, "Container image").
[containers]
# Podman's defaults raise RLIMIT_NOFILE/NPROC, which fails without CAP_SYS_RESOURCE: explicit, attainable limits.
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
# crun 1.8 (Debian 12) refuses hybrid cgroup hierarchies; runc works. No systemd: cgroupfs, events to a file.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{run_dir}/tmp"

[network]
network_backend = "netavark"
network_config_dir = "{state}/networks"
"""

STORAGE_CONF = """\
# Written by rig/image.py (make test-image): images live in the cache, kept between runs.
[storage]
driver = "overlay"
graphroot = "{state}/storage"
runroot = "{run_dir}/storage"
"""

REGISTRIES_CONF = """\
# Written by rig/image.py (make test-image): short names (python:3.11-slim, apache/kafka:...) mean Docker Hub's,
# as for Docker; local stand-ins carry those full names, so --pull=never finds them.
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
"""


def podman_env(state: Path) -> dict[str, str]:
    """Write Podman's configuration (once per change) and return the environment every podman call gets.

    runroot and tmp_dir (runtime state: which containers run) live under /run/sluice-podman, and are cleared when
    the machine has booted since the last run (as a tmpfs /run would be), so Podman never trusts stale state."""
    run_dir = Path("/run/sluice-podman")
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    boot_file = state / "boot_id"
    if boot_file.exists() and boot_file.read_text().strip() != boot_id:
        shutil.rmtree(run_dir, ignore_errors=True)
    state.mkdir(parents=True, exist_ok=True)
    boot_file.write_text(boot_id + "\n")
    files = {
        "containers.conf": CONTAINERS_CONF.format(state=state, run_dir=run_dir),
        "storage.conf": STORAGE_CONF.format(state=state, run_dir=run_dir),
        "registries.conf": REGISTRIES_CONF,
    }
    for name, text in files.items():
        path = state / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    (state / "networks").mkdir(exist_ok=True)
    return dict(
        os.environ,
        CONTAINERS_CONF=str(state / "containers.conf"),
        CONTAINERS_STORAGE_CONF=str(state / "storage.conf"),
        CONTAINERS_REGISTRIES_CONF=str(state / "registries.conf"),
    )


def check_podman(env: Mapping[str, str]) -> None:
    proc = run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}} "
                "{{.Store.GraphDriverName}} {{.Store.GraphRoot}}"], env=env, capture=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise ImageTestError(f"podman cannot run on this machine (`podman info` failed):\n{proc.stderr.strip()}")
    print(f"podman: {proc.stdout.strip()}")


# ------------------------------------------------------------------------------------------------ base images


def qualified(name: str) -> str:
    """Docker's reading of an image reference: python:3.11-slim -> docker.io/library/python:3.11-slim."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


#: the docker-compose.yml services the target brings up and checks. Grafana (provisioned by the compose file for
#: its users) is not among them: no registry answers here and its licence rules out a stand-in; the suite checks
#: its dashboard and queries instead (tests/integration/test_dashboard_alerts.py).
TESTED_SERVICES = ("kafka", "sluice", "prometheus", "app", "app-sidecar")


def compose_images() -> dict[str, str]:
    """{service: the image it names} of docker-compose.yml (a service that builds its image names the build's)."""
    compose = COMPOSE_FILE.read_text()
    images = {}
    for block in re.split(r"(?m)^  (?=\S)", compose.split("services:", 1)[1])[1:]:
        image = re.search(r"(?m)^\s+image:\s*(\S+)", block)
        if image:
            images[block.split(":", 1)[0].strip()] = image.group(1)
    return images


def needed_images() -> list[str]:
    """The images the Dockerfile and the tested docker-compose.yml services start from (not the one built)."""
    names = re.findall(r"(?m)^FROM\s+(\S+)", DOCKERFILE.read_text())
    names += [image for service, image in compose_images().items()
              if service in TESTED_SERVICES and image != SLUICE_IMAGE]
    return sorted(set(names))


def check_compose_kafka() -> None:
    """docker-compose.yml runs the Kafka release the rig runs by default (rig/kafka.py KAFKA_NEWEST)."""
    from rig.kafka import KAFKA_NEWEST

    image = compose_images().get("kafka", "")
    if image.rpartition(":")[2] != KAFKA_NEWEST:
        raise ImageTestError(f"docker-compose.yml's kafka service runs {image}, not the rig's default release "
                             f"{KAFKA_NEWEST} (rig/kafka.py KAFKA_NEWEST): update one or the other")


def image_label(env: Mapping[str, str], name: str) -> str | None:
    """None if the image is absent; its stand-in digest label ("" for an image that is not a stand-in)."""
    proc = run(["podman", "image", "inspect", "--format", f'{{{{ index .Labels "{LABEL}" }}}}', name],
               env=env, capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        return None
    label = proc.stdout.strip()
    return "" if label in ("", "<no value>") else label


#: the one probe a run makes of the registry, bounded: a stand-in cached from a day without one is not trusted forever
REGISTRY_PROBE_TIMEOUT_S = 10.0


def registry_answers() -> bool:
    """Whether Docker Hub's registry answers at all (401 to an anonymous /v2/ is an answer); one bounded probe."""
    try:
        urllib.request.urlopen("https://registry-1.docker.io/v2/", timeout=REGISTRY_PROBE_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (OSError, ValueError):
        return False
    return True


def base_image_source(label: str | None, registry: Callable[[], bool]) -> str:
    """Where a base image comes from this run, given its label here (None: absent; "": a real image; else a
    stand-in's digest): ``present`` (the real image, kept), ``pull`` (the registry answers: the real image,
    replacing a stand-in built on a day it did not), ``standin`` (it does not). ``registry`` is asked only when
    the answer depends on it."""
    if label == "":
        return "present"
    return "pull" if registry() else "standin"


def _digest(paths: Sequence[Path], extra: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for item in extra:
        h.update(item.encode() + b"\0")
    return h.hexdigest()[:16]


def host_ca_certs() -> list[Path]:
    """Local CA certificates of the host (e.g. a TLS-intercepting proxy's): the stand-ins trust them too, or pip
    inside a build cannot reach PyPI."""
    return sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))


def ensure_debian_base(env: Mapping[str, str], work: Path) -> None:
    certs = host_ca_certs()
    packages = ["ca-certificates", "passwd"]
    apt_options = ['Acquire::Languages "none"']  # no Translation-* lists in the stand-ins' apt-get update
    key = _digest(certs, [DEBIAN_SUITE, *packages, *apt_options, "v1"])
    if image_label(env, DEBIAN_BASE) == key:
        print(f"{DEBIAN_BASE}: cached")
        return
    certs_dir = work / "ca-certificates"
    certs_dir.mkdir(parents=True)
    for cert in certs:
        shutil.copy(cert, certs_dir / cert.name)
    rootfs = work / "rootfs.tar"
    t0 = time.monotonic()
    mirror = "http://deb.debian.org/debian"
    run([
        "mmdebstrap", "--variant=minbase", f"--include={','.join(packages)}", "--quiet",
        *(f"--aptopt={option}" for option in apt_options),
        f'--customize-hook=sync-in {certs_dir} /usr/local/share/ca-certificates',
        '--customize-hook=chroot "$1" update-ca-certificates',
        DEBIAN_SUITE, str(rootfs),
        f"deb {mirror} {DEBIAN_SUITE} main",
        f"deb {mirror} {DEBIAN_SUITE}-updates main",
        f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main",
    ], timeout=900)
    run(["podman", "import",
         "--change", "CMD [\"bash\"]",
         "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
         "--change", f"LABEL {LABEL}={key}",
         str(rootfs), DEBIAN_BASE], env=env)
    rootfs.unlink()
    print(f"{DEBIAN_BASE}: built in {time.monotonic() - t0:.1f}s")


@dataclass(frozen=True)
class StandIn:
    recipe: str  # a directory under rig/standins/
    context: Path
    extra_key: tuple[str, ...] = ()


def prepare_standin(name: str, work: Path) -> StandIn:
    """The build context of the stand-in for ``name`` (docker.io/...), or an error if there is none."""
    repo, _, tag = qualified(name).removeprefix("docker.io/").partition(":")
    if repo == "library/python" and tag == "3.11-slim":
        return StandIn("python", STANDINS / "python")
    if repo == "prom/prometheus":
        return StandIn("prometheus", STANDINS / "prometheus")
    if repo == "apache/kafka":
        libs = find_libs(tag)  # the rig's Maven Central cache (fetched when missing)
        context = work / "kafka"
        shutil.copytree(STANDINS / "kafka", context)
        (context / "libs").mkdir()
        for jar in sorted(libs.glob("*.jar")):
            try:
                os.link(jar, context / "libs" / jar.name)  # same filesystem as the cache: no copy
            except OSError:
                shutil.copy2(jar, context / "libs" / jar.name)
        jars = [f"{jar.name}:{jar.stat().st_size}" for jar in sorted(libs.glob("*.jar"))]
        return StandIn("kafka", context, tuple(jars))
    raise ImageTestError(f"{name} is not present, no registry answers, and rig/image.py has no stand-in for it")


def ensure_base_images(env: Mapping[str, str], work: Path) -> dict[str, str]:
    """Each base image, real or stand-in; returns name -> what was used (said at the end of the run's output)."""
    online: list[bool] = []  # the registry probe's answer, once per run

    def registry() -> bool:
        if not online:
            online.append(registry_answers())
            print(f"container registry (registry-1.docker.io) {'answers' if online[0] else 'does not answer'}")
        return online[0]

    used: dict[str, str] = {}
    for name in needed_images():
        full = qualified(name)
        label = image_label(env, full)
        source = base_image_source(label, registry)
        if source == "present":
            used[full] = "real (present)"
            print(f"{full}: present (not a stand-in)")
            continue
        if source == "pull":
            if run(["podman", "pull", full], env=env, check=False).returncode == 0:
                used[full] = "real (pulled)" if label is None else "real (pulled, replacing the stand-in)"
                continue
            print(f"{full}: the pull failed although the registry answers; a stand-in instead")
        ensure_debian_base(env, work / "debian")
        standin = prepare_standin(name, work)
        files = [p for p in (STANDINS / standin.recipe).rglob("*") if p.is_file()]
        standin_key = _digest(files, [*standin.extra_key, image_label(env, DEBIAN_BASE) or ""])
        if label == standin_key:
            used[full] = "stand-in (cached)"
            print(f"{full}: stand-in cached")
            continue
        t0 = time.monotonic()
        run(["podman", "build", "--format", "docker", "--pull=never", "--label", f"{LABEL}={standin_key}",
             "-t", full, "-f", str(standin.context / "Containerfile"), str(standin.context)], env=env)
        used[full] = "stand-in (built)"
        print(f"{full}: stand-in built in {time.monotonic() - t0:.1f}s")
    return used


# --------------------------------------------------------------------------------------------- the Sluice rig


def build_sluice(env: Mapping[str, str]) -> None:
    run(["podman", "build", "--format", "docker", "--pull=never", "-t", SLUICE_IMAGE, "-f", str(DOCKERFILE),
         str(REPO)], env=env)
    run(["podman", "image", "prune", "-f"], env=env, capture=True)  # the previous build's layers, now unnamed


def compose(exe: Path, env: Mapping[str, str], *args: str, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run([str(exe), "-p", PROJECT, "-f", str(COMPOSE_FILE), *args], env=env, cwd=REPO, check=check,
               timeout=timeout)


def _project_ps(env: Mapping[str, str]) -> list[dict[str, Any]]:
    proc = run(["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "json"],
               env=env, capture=True, quiet=True, check=False)
    try:
        return cast(list[dict[str, Any]], json.loads(proc.stdout or "[]"))
    except ValueError:
        return []


def project_containers(env: Mapping[str, str]) -> dict[str, str]:
    """{service: container name} of the compose project."""
    return {(c.get("Labels") or {}).get("com.docker.compose.service", "?"): c["Names"][0] for c in _project_ps(env)}


def project_exited(env: Mapping[str, str]) -> str | None:
    """The compose project's containers that are not running, described with their last log line (why, most often;
    None: all run)."""
    def described(c: dict[str, Any]) -> str:
        last = run(["podman", "logs", "--tail", "1", c["Names"][0]], env=env, capture=True, quiet=True, check=False)
        return (f"{(c.get('Labels') or {}).get('com.docker.compose.service', '?')} {c.get('State')} "
                f"(exit code {c.get('ExitCode')}; last line {(last.stdout + last.stderr).strip()[-400:]!r})")

    down = [described(c) for c in _project_ps(env) if c.get("State") != "running"]
    return "; ".join(down) or None


def check_ports_free() -> None:
    for port in HOST_PORTS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError as exc:
                raise ImageTestError(
                    f"port {port} is taken on this host ({exc.strerror}); docker-compose.yml publishes "
                    f"{', '.join(map(str, HOST_PORTS))}: stop what listens there (a `make run`?) and retry"
                ) from None


def show_logs(env: Mapping[str, str], lines: int = 60) -> None:
    for service, name in sorted(project_containers(env).items()):
        print(f"\n--- {service} ({name}): last {lines} log lines ---", flush=True)
        run(["podman", "logs", "--tail", str(lines), name], env=env, check=False, quiet=True)


# ------------------------------------------------------------------------------------------------ the checks


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(what: str, probe: Callable[[], str | None], env: Mapping[str, str], timeout: float,
             interval: float = 0.5) -> None:
    """Poll ``probe`` (None = done, else why not yet) until done or ``timeout``; fail at once when a container of
    the rig has stopped (nothing would change)."""
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    while True:
        try:
            why = probe()
        except (OSError, ValueError, KeyError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why is None:
            print(f"{what}: after {time.monotonic() - t0:.1f}s")
            return
        exited = project_exited(env)
        if exited:
            raise ImageTestError(f"{what}: a container stopped: {exited} (last: {why})")
        if time.monotonic() >= deadline:
            raise ImageTestError(f"{what}: not after {timeout:.0f}s ({why})")
        time.sleep(interval)


def check_ready(env: Mapping[str, str]) -> None:
    def probe() -> str | None:
        status, body = http_get(f"{ADMIN_URL}/readyz")
        return None if status == 200 else f"/readyz answered {status} {body.decode(errors='replace').strip()}"

    wait_for("Sluice /readyz is 200", probe, env, timeout=120)


def check_healthcheck(env: Mapping[str, str]) -> None:
    name = project_containers(env).get("sluice")
    if name is None:
        raise ImageTestError("no sluice container in the compose project")
    proc = run(["podman", "healthcheck", "run", name], env=env, capture=True, check=False)
    if proc.returncode != 0:
        raise ImageTestError(f"the image's HEALTHCHECK failed in {name}: {(proc.stdout + proc.stderr).strip()}")
    print(f"HEALTHCHECK of {name}: healthy")


def check_produce_consume(records: int = RECORDS) -> None:
    """kafka-python, on the host, through Sluice: every record produced is consumed once, in order."""
    from kafka.errors import KafkaError

    try:
        _produce_consume(records)
    except KafkaError as exc:
        raise ImageTestError(f"kafka-python through Sluice ({BOOTSTRAP}): {type(exc).__name__}: {exc}") from exc


def _produce_consume(records: int) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    topic = f"image-test-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP, client_id="sluice-test-image")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    expected = [b"record-%06d" % i for i in range(records)]
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic, key=b"k%d" % (i % 7), value=v) for i, v in enumerate(expected)]
        producer.flush(timeout=60)
        offsets = [f.get(timeout=60).offset for f in futures]
    finally:
        producer.close()
    if offsets != list(range(records)):
        raise ImageTestError(f"produced offsets are not 0..{records - 1} in order: {offsets[:10]}...")
    print(f"produced {records} records to {topic} through {BOOTSTRAP}")

    consumer = KafkaConsumer(topic, bootstrap_servers=BOOTSTRAP, group_id=f"{topic}-group",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        # to the log's end offset, not to the count sent: a record stored twice after the last one is read too
        partition = TopicPartition(topic, 0)
        end = consumer.end_offsets([partition])[partition]
        # Its group joined (in poll) only once its metadata names the topic's partition: joined sooner, kafka-python
        # 3.0.12 can lose its first assignment for good (rig/kafka_python_group.py).
        try:
            wait_partitions_known(consumer, topic, 1, max(0.0, deadline - time.monotonic()))
        except RigError as exc:
            raise ImageTestError(str(exc)) from exc
        while len(got) < end and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                got.extend(r.value for r in batch)
        consumer.commit()
    finally:
        consumer.close()
    if got != expected:
        dup = len(got) - len(set(got))
        diff = [(i, g) for i, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e][:3]
        raise ImageTestError(f"consumed {len(got)} records ({dup} duplicates), expected {records} in order; "
                             f"first differences (index, record): {diff}")
    print(f"consumed all {records} records once, in order (group {topic}-group)")


def app_events(env: Mapping[str, str], container: str) -> list[dict[str, Any]]:
    """The JSON events rig/example_app.py wrote to its container's stdout so far."""
    proc = run(["podman", "logs", container], env=env, capture=True, check=False, quiet=True)
    events = []
    for line in proc.stdout.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and "event" in event:
                events.append(event)
    return events


def check_sidecar_example(env: Mapping[str, str]) -> None:
    """The compose file's sidecar pair: app-sidecar runs in app's network namespace, and the application produced
    and consumed every record through it at localhost (it reaches no broker otherwise)."""
    names = project_containers(env)
    app, sidecar = names.get("app"), names.get("app-sidecar")
    if app is None or sidecar is None:
        raise ImageTestError(f"the sidecar example's containers are not all up: {sorted(names)}")
    mode = run(["podman", "inspect", "--format", "{{.HostConfig.NetworkMode}}", sidecar], env=env, capture=True,
               quiet=True).stdout.strip()
    app_id = run(["podman", "inspect", "--format", "{{.Id}}", app], env=env, capture=True, quiet=True).stdout.strip()
    if mode not in (f"container:{app_id}", f"container:{app}"):
        raise ImageTestError(f"{sidecar} does not share {app}'s network namespace (network mode {mode!r})")
    records = int(re.search(r'RECORDS: "(\d+)"', COMPOSE_FILE.read_text()).group(1))  # type: ignore[union-attr]

    def consumed() -> str | None:
        events = app_events(env, app)
        failed = [e for e in events if e["event"] == "failed"]
        if failed:
            raise ImageTestError(f"the example application failed: {failed[0]}")
        done = [e for e in events if e["event"] == "committed" and e["offset"] == records]
        return None if done else f"last event {events[-1] if events else None}"

    wait_for(f"the example application consumed its {records} records through its sidecar", consumed, env,
             timeout=120)


def check_prometheus(env: Mapping[str, str]) -> None:
    def target_up() -> str | None:
        _, body = http_get(f"{PROMETHEUS_URL}/api/v1/targets")
        targets = json.loads(body)["data"]["activeTargets"]
        sluice = [t for t in targets if t["labels"].get("job") == "sluice"]
        if not sluice:
            return f"no sluice target among {[t['labels'] for t in targets]}"
        health = sluice[0]["health"]
        return None if health == "up" else f"sluice target health {health!r} {sluice[0].get('lastError', '')}"

    wait_for("Prometheus: sluice target up", target_up, env, timeout=90, interval=1.0)

    def series() -> str | None:
        query = urllib.parse.quote('count by (__name__) ({__name__=~"sluice_.+", job="sluice"})')
        _, body = http_get(f"{PROMETHEUS_URL}/api/v1/query?query={query}")
        result = json.loads(body)["data"]["result"]
        names = sorted(r["metric"]["__name__"] for r in result)
        if "sluice_requests_total" not in names:
            return f"sluice_requests_total not scraped yet ({len(names)} sluice_ metrics)"
        print(f"Prometheus has {len(names)} sluice_ metrics from the sluice job, e.g. {', '.join(names[:4])}")
        return None

    wait_for("Prometheus: sluice_ series scraped", series, env, timeout=60, interval=1.0)


# --------------------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.image", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-up", action="store_true", help="leave the rig running after the checks")
    args = parser.parse_args(argv)
    timings = Timings(time.monotonic(), [])
    state = cache_root() / "podman"
    up = False
    exe: Path | None = None
    env: dict[str, str] = {}
    ok = False
    failure = ""  # repeated in the summary: CI shows a log's tail, and the containers' logs come between
    bases: dict[str, str] = {}
    try:
        ensure_root()
        state.mkdir(parents=True, exist_ok=True)
        with file_lock(state / ".lock"):  # one run at a time per cache: same ports, same project
            check_compose_kafka()
            with timings.step("host tools (Debian packages, podman-compose, Podman's configuration)"):
                ensure_host_packages()
                exe = ensure_podman_compose(state)
                env = podman_env(state)
                check_podman(env)
            with tempfile.TemporaryDirectory(prefix="build-", dir=state) as work, \
                    timings.step("base images (present, pulled, or local stand-ins)"):
                bases = ensure_base_images(env, Path(work))
            with timings.step("Sluice image (podman build --format docker --pull=never)"):
                build_sluice(env)
            with timings.step("docker-compose.yml up (podman-compose)"):
                if project_containers(env):
                    compose(exe, env, "down", check=False)  # a previous run's leftovers
                check_ports_free()
                up = True
                compose(exe, env, "up", "-d", "--no-build", *TESTED_SERVICES)
            with timings.step("checks from the host"):
                check_ready(env)
                check_produce_consume()
                check_healthcheck(env)
                check_prometheus(env)
                check_sidecar_example(env)
            if not args.keep_up:
                with timings.step("docker-compose.yml down"):
                    compose(exe, env, "down", timeout=120)
                up = False
            with timings.step("Kubernetes: the Helm chart's pod (helm lint, sluice-kubecheck, podman kube play)"):
                from rig.kube_pod import run_pod_test

                run_pod_test(env)
            ok = True
    except ImageTestError as exc:
        failure = f": {exc}"
        print(f"\nmake test-image: FAILED{failure}", file=sys.stderr, flush=True)
        if up and env:
            show_logs(env)
    except Exception as exc:  # a bug here, or a client library's surprise: the traceback, the logs, the rig down
        failure = f" (unexpected {type(exc).__name__}: {exc})"
        traceback.print_exc()
        print("\nmake test-image: FAILED (unexpected error above)", file=sys.stderr, flush=True)
        if up and env:
            show_logs(env)
    finally:
        if up and exe is not None and not (ok and args.keep_up):
            with timings.step("docker-compose.yml down"):
                with contextlib.suppress(ImageTestError):
                    compose(exe, env, "down", timeout=120)
        standins = sorted(n for n, how in bases.items() if how.startswith("stand-in"))
        images = ("base images: " + ", ".join(f"{n} {how}" for n, how in sorted(bases.items())) + "; "
                  + (f"LOCAL STAND-INS for {', '.join(standins)} (no registry answered)" if standins
                     else "all real")) if bases else "base images: not reached"
        print(f"\nmake test-image: {'ok' if ok else 'FAILED' + failure}\n{images}\n{timings.summary()}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    # main of the module rig.image, not of __main__: rig/kube_pod.py raises rig.image's ImageTestError
    from rig.image import main as rig_main

    sys.exit(rig_main())
