"""A real Prometheus (Debian's ``prometheus`` package) for tests: the server on a free port with its own storage,
scraping a Sluice admin port with the project's config/prometheus.yml (and loading its rule files), queried
through its HTTP API; and promtool.

A missing ``prometheus``/``promtool`` is a failure, never a skip: ``make install`` installs them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rig.kafka import free_ports

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_YML = REPO / "config" / "prometheus.yml"


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; AssertionError naming the install step when missing."""
    path = shutil.which(name)
    assert path, f"{name} not found on PATH: install Debian's `prometheus` package (`make install` does)"
    return path


def promtool(*args: str, input_text: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``promtool ARGS``; the completed process (its returncode is for the caller to assert)."""
    return subprocess.run([binary("promtool"), *args], input=input_text, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def rule_files(config_text: str) -> list[str]:
    """The entries of a Prometheus config's ``rule_files:`` list, as written (block list form)."""
    block = re.search(r"(?m)^rule_files:\s*\n((?:[ \t]+-.*\n?|[ \t]*#.*\n|[ \t]*\n)*)", config_text)
    if block is None:
        return []
    return [m.group(1).strip().strip("\"'") for m in re.finditer(r"(?m)^[ \t]+-[ \t]*(\S+)", block.group(1))]


def prometheus_config(admin_port: int, config: Path = PROMETHEUS_YML) -> str:
    """config/prometheus.yml with its single target pointed at this Sluice's admin port, scrape and rule
    evaluation every second, and its rule files made absolute (Prometheus resolves them relative to the config
    file, which the test writes elsewhere)."""
    text = config.read_text()
    text, n = re.subn(r"targets:\s*\[[^\]]*\]", f'targets: ["127.0.0.1:{admin_port}"]', text)
    assert n == 1, f"expected one targets list in {config}, found {n}"
    text, n = re.subn(r"(?m)^(\s*scrape_interval:\s*)\S+", r"\g<1>1s", text)
    assert n >= 1, f"no scrape_interval in {config}"
    text = re.sub(r"(?m)^(\s*evaluation_interval:\s*)\S+", r"\g<1>1s", text)
    for entry in rule_files(text):
        path = (config.parent / entry).resolve()
        assert path.is_file(), f"{config}: rule file {entry} does not exist ({path})"
        text, n = re.subn(rf"(?m)^([ \t]+-[ \t]*){re.escape(entry)}[ \t]*$", rf"\g<1>{path}", text)
        assert n == 1, f"{config}: rule file {entry} listed {n} times"
    return text


class Prometheus:
    """A prometheus server subprocess on a free 127.0.0.1 port with its own temp storage."""

    def __init__(self, config_text: str) -> None:
        self.binary = binary("prometheus")
        self.tmp = Path(tempfile.mkdtemp(prefix="sluice-prom-"))
        config = self.tmp / "prometheus.yml"
        config.write_text(config_text)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.tmp / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited with {self.proc.returncode}:\n{self.log_text()}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)  # bounded poll of /-/ready
        raise AssertionError(f"prometheus not ready after {timeout}s:\n{self.log_text()}")

    def api(self, path: str, params: Sequence[tuple[str, str]] = ()) -> Any:
        """GET /api/v1/<path>; its ``data`` (AssertionError with Prometheus' error when the status is not
        success, e.g. a PromQL syntax error)."""
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {list(params)}: {body}"
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query; the result vector ([{"metric": {...}, "value": [ts, "v"]}, ...])."""
        data = self.api("query", [("query", promql)])
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, promql: str, start: float, step: float = 1.0) -> list[dict[str, Any]]:
        """A range query from ``start`` (Unix time) to now, as Grafana queries a panel; the result matrix
        ([{"metric": {...}, "values": [[ts, "v"], ...]}, ...])."""
        data = self.api("query_range", [("query", promql), ("start", f"{start:.3f}"),
                                        ("end", f"{time.time():.3f}"), ("step", str(step))])
        assert data["resultType"] == "matrix", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, promql: str, check: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0,
                 since: float | None = None) -> list[dict[str, Any]]:
        """Poll `promql` until `check(result)` holds (Prometheus scrapes every second); AssertionError with the
        last result otherwise. An instant query, or with ``since`` a range query from then to now."""
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            last = self.query(promql) if since is None else self.query_range(promql, since)
            if check(last):
                return last
            time.sleep(0.25)  # bounded poll of Prometheus' answer
        raise AssertionError(f"{promql}: condition not met in {timeout}s, last result {last}\n{self.log_text()}")

    def rules(self) -> list[dict[str, Any]]:
        """Every rule Prometheus loaded (/api/v1/rules), each with its group's ``file`` and ``group`` added."""
        out = []
        for group in self.api("rules")["groups"]:
            for rule in group["rules"]:
                out.append({**rule, "file": group["file"], "group": group["name"]})
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def scalar(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if result else None
