"""Sluice as a real subprocess (``python -m proxy run``), for tests and benches that need a separate process:
signals (graceful shutdown), a Prometheus scraping its admin port, CPU time, RSS and open fds measured with
psutil, a crash (:meth:`SluiceProcess.kill`, SIGKILL) and a restart on the same ports.

It lives in ``rig/`` (not ``tests/support``) so ``bench/`` can use it without importing the test tree;
``tests.support.subprocess_proxy`` re-exports it as ``SubprocessProxy``.

Ports: the bootstrap, broker-base and admin ports are picked free on 127.0.0.1 before the start (broker node N
listens on base + N; by default the base is chosen so node ``node_id``'s port is free). The start is complete
when /readyz answers 200 *and* the bootstrap port accepts a TCP connection, polled with a deadline; if the
process exits first, the error carries its stderr.

The operational log (JSON lines, stderr) goes to a temp file, readable at any time with :meth:`stderr_text`;
the access log is off unless ``access_log`` names a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from rig.cpu import cpu_seconds
from rig.kafka import RIG_NODE_IDS, RigError, free_ports, set_pdeathsig

__all__ = ["SluiceProcess", "pick_ports"]


def pick_ports(node_ids: int = RIG_NODE_IDS) -> tuple[int, int, int]:
    """(bootstrap port, broker port base, admin port), all free. Sluice serves every broker node N its metadata
    names on base + N (proxy/server.py open_listener), so base + 1 .. base + ``node_ids`` are all picked free and
    handed out, not only one node's: a sidecar opens base + 2 once its consumer's metadata names node 2, and a port
    picked for another listener meanwhile could not be bound (the likely cause of a bench smoke run whose sidecar
    found its admin port taken). Base is above bootstrap and is never the admin port, as the config requires
    (proxy/config/loader.py)."""
    bootstrap, *_ = free_ports(node_ids + 2, consecutive=True)  # bootstrap, base (node 0), nodes 1..node_ids
    (admin,) = free_ports(1)
    return bootstrap, bootstrap + 1, admin


#: how long a start may take before the rig calls it hung (a guard: a start is never timed by it). On an idle machine
#: Sluice is ready in about a second; CI starts benches' Sluices at the lowest CPU priority beside its test sessions,
#: where starts took 11-16 s and some went past 30 s.
START_TIMEOUT_S = 120.0


class SluiceProcess:
    """``python -m proxy run`` in front of ``upstream`` (``host:port``), on free 127.0.0.1 ports.

    >>> with SluiceProcess(broker.bootstrap) as sluice:
    ...     use(sluice.bootstrap, sluice.admin_url)
    ...     code = sluice.stop()        # SIGTERM, wait; the exit code
    """

    def __init__(
        self,
        upstream: str,
        extra_env: Mapping[str, str] | None = None,
        access_log: str | os.PathLike[str] | None = None,
        *,
        node_id: int = 1,
        start_timeout: float = START_TIMEOUT_S,
        python: str | None = None,
        ports: tuple[int, int, int] | None = None,
        code: Path | None = None,
        poll_s: float = 0.05,
        wait: bool = True,
    ) -> None:
        self.upstream = upstream
        self.node_id = node_id
        # ``ports``: picked beforehand (``pick_ports``), e.g. because a broker's config must name the sidecar's port
        # before either starts (rig/cluster.py)
        self.bootstrap_port, self.broker_port_base, self.admin_port = ports or pick_ports(max(node_id, RIG_NODE_IDS))
        self._tmp = Path(tempfile.mkdtemp(prefix="sluice-proc-"))
        self._stderr_path = self._tmp / "stderr.log"
        self._stdout_path = self._tmp / "stdout.log"
        env = {k: v for k, v in os.environ.items() if not (k.upper().startswith("SLUICE_") and "__" in k)}
        env.update(
            {
                "SLUICE_UPSTREAM__BOOTSTRAP_SERVERS": upstream,
                "SLUICE_LISTEN__HOST": "127.0.0.1",
                "SLUICE_LISTEN__ADVERTISED_HOST": "127.0.0.1",
                "SLUICE_LISTEN__BOOTSTRAP_PORT": str(self.bootstrap_port),
                "SLUICE_LISTEN__BROKER_PORT_BASE": str(self.broker_port_base),
                "SLUICE_ADMIN__ENABLED": "true",
                "SLUICE_ADMIN__HOST": "127.0.0.1",
                "SLUICE_ADMIN__PORT": str(self.admin_port),
                "SLUICE_LOGGING__ACCESS_LOG": os.fspath(access_log) if access_log is not None else "off",
                "SLUICE_LOGGING__FORMAT": "json",
            }
        )
        env.pop("SLUICE_CONFIG", None)
        env.update(extra_env or {})
        self.command = [python or sys.executable, "-m", "proxy", "run"]
        #: the checkout whose ``proxy`` package runs: this one, or another revision's (bench/support/revision.py)
        self.code = code or Path(__file__).resolve().parent.parent
        self._env = env
        self.start_timeout = start_timeout
        #: how often readiness is polled while starting (bench/footprint.py times the start finer than tests need)
        self.poll_s = poll_s
        #: seconds from the exec of the last (re)start to ready (/readyz 200 and the bootstrap port accepting),
        #: to within ``poll_s``
        self.ready_s = 0.0
        self.returncode: int | None = None
        self._spawn("wb", wait)

    def _spawn(self, mode: str, wait: bool = True) -> None:
        with open(self._stderr_path, mode) as err, open(self._stdout_path, mode) as out:
            self._started = time.monotonic()
            self._proc = subprocess.Popen(
                self.command,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=str(self.code),
                preexec_fn=set_pdeathsig,  # only asks Linux to SIGTERM it if we die
            )
        self.returncode = None
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Return once the process serves (its /readyz and its bootstrap port answer), within ``start_timeout``;
        else it is killed and RigError says why. What ``wait=False`` left to the caller: several started at once,
        then each waited for."""
        try:
            self._wait_ready(self.start_timeout)
        except BaseException:
            self.kill()
            raise
        self.ready_s = time.monotonic() - self._started

    def restart(self, wait: bool = True) -> None:
        """Start Sluice again on the same ports with the same settings, once the previous process has exited
        (after :meth:`kill` or :meth:`stop`; a running one is stopped first). The logs of every run are kept, one
        after the other. Returns once the new process is ready, as the first start does (``wait=False``: at once,
        :meth:`wait_ready` left to the caller, so several restart together)."""
        if self._proc.poll() is None:
            self.stop()
        self._spawn("ab", wait)

    # ---- addresses ---------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.bootstrap_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def broker_port(self, node_id: int | None = None) -> int:
        """The port Sluice serves broker ``node_id`` on (default: the node given at construction)."""
        return self.broker_port_base + (self.node_id if node_id is None else node_id)

    @property
    def listener_ports(self) -> set[int]:
        """Every port Sluice listens on for Kafka clients, read from its own "listening" log events."""
        ports = {self.bootstrap_port}
        for event in self.log_events():
            if event.get("event") == "listening" and isinstance(event.get("port"), int):
                ports.add(event["port"])
        return ports

    # ---- output ------------------------------------------------------------------------------------------

    def stderr_text(self) -> str:
        """Everything the process wrote to stderr so far (its operational log)."""
        try:
            return self._stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def stdout_text(self) -> str:
        try:
            return self._stdout_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_events(self) -> list[dict[str, Any]]:
        """The operational log's JSON events so far (lines that are not JSON objects are skipped)."""
        events: list[dict[str, Any]] = []
        for line in self.stderr_text().splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    events.append(event)
        return events

    def metrics_text(self, timeout: float = 30.0) -> str:
        """Sluice's /metrics. The timeout bounds a read of its state, not its speed (a test's wait has its own
        deadline): 5 s failed a test on a CI-like run whose 2-core machine ran at a load of 15-19, a Sluice of five
        started at once answering later than that."""
        with urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=timeout) as resp:
            return str(resp.read().decode())

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """One sample's value from /metrics (0.0 when the series does not exist yet)."""
        from prometheus_client.parser import text_string_to_metric_families

        want = dict(labels or {})
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in want.items()):
                    return float(sample.value)
        return 0.0

    # ---- the process, as the OS sees it -----------------------------------------------------------------

    def _ps(self) -> Any:
        import psutil

        return psutil.Process(self._proc.pid)

    def rss_bytes(self) -> int:
        """Resident set size of the running process (psutil)."""
        return int(self._ps().memory_info().rss)

    def vm_kib(self) -> dict[str, int]:
        """The kernel's memory figures of the running process, in KiB, from /proc/PID/status: VmRSS (resident now)
        and VmHWM (the most it was resident at any moment since exec: a start-up peak shows there)."""
        out: dict[str, int] = {}
        with open(f"/proc/{self._proc.pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
        return out

    def num_fds(self) -> int:
        """Open file descriptors of the running process: listeners, client and upstream sockets, log files."""
        return int(self._ps().num_fds())

    def cpu_seconds(self) -> float:
        """User + system CPU time of the running process so far, to the nanosecond (rig/cpu.py)."""
        return cpu_seconds(self.pid)

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "not polled yet"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.returncode = self._proc.returncode
                raise RigError(f"sluice exited with {self.returncode} while starting:\n{self.log_tail()}")
            ready, last = self.readiness()
            if ready:
                return
            time.sleep(self.poll_s)  # bounded poll of a real condition (readiness), not a synchronising sleep
        raise RigError(f"sluice not ready after {timeout:.0f}s ({last}):\n{self.log_tail()}")

    def readiness(self) -> tuple[bool, str]:
        """(ready: /readyz 200 and the bootstrap port accepts, what was found)."""
        try:
            with urllib.request.urlopen(f"{self.admin_url}/readyz", timeout=2.0) as resp:
                if resp.status != 200:
                    return False, f"/readyz {resp.status}"
        except urllib.error.HTTPError as exc:
            return False, f"/readyz {exc.code}"
        except (OSError, urllib.error.URLError) as exc:
            return False, f"/readyz: {exc}"
        try:
            with socket.create_connection(("127.0.0.1", self.bootstrap_port), timeout=2.0):
                pass
        except OSError as exc:
            return False, f"bootstrap port: {exc}"
        return True, "ready"

    def log_tail(self, lines: int = 40) -> str:
        """For error messages: the last lines of its operational log."""
        return "\n".join(self.stderr_text().strip().splitlines()[-lines:])

    @property
    def is_running(self) -> bool:
        return self._proc.poll() is None

    def signal(self, sig: int) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; its exit code. subprocess.TimeoutExpired if it does not in time."""
        self.returncode = self._proc.wait(timeout)
        return self.returncode

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful shutdown), wait up to ``timeout``; the exit code. Killed (and RigError) if it
        does not exit in time."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise RigError(f"sluice did not exit within {timeout:.0f}s of SIGTERM:\n{self.log_tail()}") from None
        self.returncode = self._proc.returncode
        return self.returncode

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(10)
        self.returncode = self._proc.returncode

    def close(self) -> None:
        """Stop (if running) and remove the temp dir."""
        try:
            if self._proc.poll() is None:
                self.stop()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> SluiceProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running else f"exited {self._proc.returncode}"
        return f"<SluiceProcess pid={self.pid} {self.bootstrap} admin={self.admin_url} {state}>"
