"""`make run`: a real Kafka broker (`make run BROKERS=3`: a KRaft cluster) with Sluice in front of it, until Ctrl-C.

Starts the rig's broker (``--brokers N`` > 1: N brokers and one controller, rig/cluster.py), then
`sluice run --config config/sluice.toml` as a subprocess with its upstream pointed at the broker(s) (env override
SLUICE_UPSTREAM__BOOTSTRAP_SERVERS, the SLUICE_<SECTION>__<KEY> form), waits until the proxy answers Kafka requests
on its bootstrap listener, prints where to connect, and on Ctrl-C stops the proxy first (so clients see the proxy
go, not the brokers behind it) and then the brokers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from rig.cluster import KafkaCluster
from rig.kafka import KafkaBroker, RigError, classpath, metadata_brokers, set_pdeathsig, tail_file

REPO = Path(__file__).resolve().parent.parent

# The proxy's defaults (config/sluice.toml): bootstrap listener 127.0.0.1:19092, broker N on 19093 + N,
# admin/metrics HTTP on 127.0.0.1:9644.
DEFAULT_PROXY_BOOTSTRAP = "127.0.0.1:19092"
DEFAULT_METRICS_URL = "http://127.0.0.1:9644/metrics"


def find_sluice() -> str:
    """The `sluice` console script of this venv (next to the running python), else the one on PATH."""
    beside = Path(sys.executable).parent / "sluice"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("sluice")
    if found:
        return found
    raise RigError("the `sluice` command is not installed in this environment; run `make install`")


def _split_hostport(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


def _wait_proxy_ready(proc: subprocess.Popen[bytes], address: str, timeout: float, log: Path) -> None:
    """Ready = the proxy's bootstrap listener answers a Metadata request (relayed to the broker and back)."""
    host, port = _split_hostport(address)
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        code = proc.poll()
        if code is not None:
            raise RigError(f"sluice exited with code {code} during startup\n--- {log} ---\n{tail_file(log, 40)}")
        try:
            if metadata_brokers(host, port, timeout=2.0):
                return
            last = "Metadata answered with no brokers"
        except (OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise RigError(
                f"sluice not answering on {address} after {timeout:.0f}s ({last})\n--- {log} ---\n{tail_file(log, 40)}"
            )
        time.sleep(0.1)  # poll interval of the readiness check above


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int | None:
    """SIGTERM (the proxy drains and closes its listeners), wait, then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def _banner(kafka: KafkaBroker | KafkaCluster, bootstrap: str, metrics_url: str, log: Path, stream_logs: bool) -> str:
    cp = classpath(kafka.libs_dir)
    if isinstance(kafka, KafkaCluster):
        what = f"a real Kafka cluster of {len(kafka.brokers)} brokers (KRaft, one controller)"
        logs = "\n".join(f"  broker {b.node_id}:              {b.bootstrap}, log {b.log_path}" for b in kafka.brokers)
    else:
        what = f"a real Kafka {kafka.bootstrap} (node {kafka.node_id})"
        logs = f"  broker log:            {kafka.log_path}"
    return f"""
Sluice is running in front of {what}.

  bootstrap (use this):  {bootstrap}
  metrics:               {metrics_url}
  proxy log:             {"this terminal" if stream_logs else log}
{logs}

Produce a few records (type lines, Ctrl-D to end):
  java -cp '{cp}' org.apache.kafka.tools.ConsoleProducer --bootstrap-server {bootstrap} --topic demo
Consume them:
  java -cp '{cp}' org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server {bootstrap} \\
       --topic demo --from-beginning
Or from Python (kafka-python):
  {sys.executable} -c "from kafka import KafkaProducer as P; p=P(bootstrap_servers='{bootstrap}'); \\
       p.send('demo', b'hello'); p.flush()"

Ctrl-C stops the proxy, then Kafka.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "config" / "sluice.toml"), help="Sluice config file")
    parser.add_argument("--bootstrap", default=DEFAULT_PROXY_BOOTSTRAP, help="the proxy's bootstrap listener")
    parser.add_argument("--metrics-url", default=DEFAULT_METRICS_URL)
    parser.add_argument("--logs", action="store_true", help="stream the proxy's logs here instead of a file")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the proxy to answer")
    parser.add_argument("--brokers", type=int, default=int(os.environ.get("BROKERS") or 1),
                        help="brokers to start (default 1, or $BROKERS; > 1: a KRaft cluster with one controller)")
    args = parser.parse_args(argv)

    # Ctrl-C must raise KeyboardInterrupt even when started from a shell that ignores SIGINT for background
    # jobs; SIGTERM (e.g. from a supervisor) unwinds the same way: `finally` stops both processes.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    log_dir = Path(tempfile.mkdtemp(prefix="sluice-run-"))
    proxy_log = log_dir / "sluice.log"
    if args.brokers < 1:
        parser.error("--brokers must be at least 1")
    broker: KafkaBroker | KafkaCluster = KafkaBroker() if args.brokers == 1 else KafkaCluster(args.brokers)
    proxy: subprocess.Popen[bytes] | None = None
    out: IO[bytes] | None = None
    clean = False  # keep the proxy log for a post-mortem unless the user stopped us
    try:
        print(f"starting Kafka ({args.brokers} broker{'s' if args.brokers > 1 else ''}) ...", flush=True)
        broker.start()
        print(f"Kafka ready at {broker.bootstrap} in {broker.last_start_seconds:.1f}s; starting Sluice ...", flush=True)
        env = dict(os.environ, SLUICE_UPSTREAM__BOOTSTRAP_SERVERS=broker.bootstrap)
        cmd = [find_sluice(), "run", "--config", args.config]
        out = None if args.logs else open(proxy_log, "ab")  # closed in finally
        proxy = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            # Own process group: Ctrl-C reaches only us, and we stop the proxy before the broker.
            start_new_session=True,
            preexec_fn=set_pdeathsig,  # main thread: the proxy dies with us
        )
        _wait_proxy_ready(proxy, args.bootstrap, args.timeout, proxy_log)
        print(_banner(broker, args.bootstrap, args.metrics_url, proxy_log, args.logs), flush=True)
        # Run until Ctrl-C or until either process dies (then say which, and why).
        while True:
            code = proxy.poll()
            if code is not None:
                print(
                    f"sluice exited with code {code}\n{'' if args.logs else tail_file(proxy_log, 40)}", file=sys.stderr
                )
                return 1
            for node in broker.brokers if isinstance(broker, KafkaCluster) else [broker]:
                if not node.is_running:
                    print(f"Kafka node {node.node_id} exited unexpectedly\n{node.log_tail()}", file=sys.stderr)
                    return 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                proxy.wait(timeout=1.0)
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        clean = True
        return 0
    except RigError as exc:
        print(f"rig: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if proxy is not None:
            _stop(proxy)
        if out is not None:
            out.close()
        broker.close()
        if clean:
            shutil.rmtree(log_dir, ignore_errors=True)
        elif not args.logs:
            print(f"proxy log kept: {proxy_log}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
