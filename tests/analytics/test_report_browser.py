"""`sluice report` end to end (the CLI, in this process, with its own local[2] Spark session), and the report it
writes opened in a real headless Chromium (Debian's ``chromium``; ``make install`` installs it): a screenshot
shows the charts, and the browser itself reports every embedded image decoded.

A missing Chromium fails these tests: a report nobody checked in a browser is not known to render.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bench.support.gen_logs import generate
from proxy.cli import main
from tests.analytics.conftest import sluice

CHROMIUM = "/usr/bin/chromium"
WINDOW = (1280, 2400)
# matplotlib's first series colours (tab:blue lines, the bar charts' blue): only charts draw them on this page
CHART_BLUES = ((31, 119, 180), (76, 114, 176))
# Appended to a copy of the report (the report itself has no script): after the load event, what the browser made
# of every <img>. --virtual-time-budget keeps Chromium running until it has fired.
PROBE = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify({
    images: imgs.length,
    decoded: imgs.filter((i) => i.complete && i.naturalWidth > 0).length,
    smallest: Math.min(...imgs.map((i) => i.naturalWidth)),
  });
  document.body.appendChild(pre);
});
</script></body>"""


@dataclass
class Report:
    out: Path
    summary: dict[str, Any]
    stderr: str


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Report]:
    base = tmp_path_factory.mktemp("cli-report")
    generate(base / "logs", 20_000, files=2, malformed=5, extensions=True, span_s=900, seed=11)
    rc, out, err = sluice("report", "--logs", str(base / "logs"), "--out", str(base / "out"), "--master", "local[2]",
                          "--move-bytes", "50GiB", "--move-within", "2h", "--conf", "spark.sql.shuffle.partitions=4")
    assert rc == 0, err
    yield Report(base / "out", json.loads(out.strip().splitlines()[-1]), err)


def chromium(*args: str, user_data: Path) -> subprocess.CompletedProcess[str]:
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.fail(f"{CHROMIUM} is missing: `make install` installs Debian's chromium package")
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         f"--user-data-dir={user_data}", *args],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "HOME": str(user_data)},
    )


def test_cli_usage_errors_exit_2_before_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--logs", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["report", "--table", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # argparse's own usage error
        main(["stream", "--kafka", "127.0.0.1:1", "--out", str(tmp_path), "--table", "t", "--no-table"])
    assert usage.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["report", "--logs", str(tmp_path), "--out", str(tmp_path), "--move-bytes", "lots"]) == 2
    assert "not a byte size" in capsys.readouterr().err
    assert main(["report", "--logs", str(tmp_path), "--out", str(tmp_path), "--conf", "novalue"]) == 2
    assert main(["report", "--kafka", "127.0.0.1:1", "--from", "yesterday", "--out", str(tmp_path)]) == 2
    assert "ISO-8601" in capsys.readouterr().err
    assert main(["report", "--logs", str(tmp_path), "--from", "2025-01-31T12:00:00Z", "--out", str(tmp_path)]) == 2
    assert "use them with --kafka" in capsys.readouterr().err
    assert main(["report", "--kafka", "127.0.0.1:1", "--from", "2025-01-31T13:00:00Z", "--to", "2025-01-31T12:00:00Z",
                 "--out", str(tmp_path)]) == 2
    assert main(["stream", "--kafka", "127.0.0.1:1", "--out", str(tmp_path), "--keep", "10s"]) == 2
    assert "at least a minute" in capsys.readouterr().err
    assert main(["stream", "--kafka", "127.0.0.1:1", "--out", str(tmp_path), "--kafka-option", "x"]) == 2


def test_cli_writes_report_tables_and_summary(report: Report) -> None:
    s = report.summary
    assert s["valid"] == 20_000 and s["malformed"] == 5 and s["files"] == 2
    assert (report.out / "report.html").is_file() and (report.out / "summary.json").is_file()
    assert json.loads((report.out / "summary.json").read_text()) == s
    for name in ("traffic_over_time", "by_client", "latency_by_api", "partition_bytes", "throttle_over_time"):
        assert list((report.out / "parquet" / name).glob("*.parquet")), name
    t = s["throttle"]
    # 50 GiB in 2 h over the observed inbound rate: a throttle inside the KIP-73 safe range
    assert t["feasible"] and t["safe_low_bps"] < t["recommended_bps"] < t["safe_high_bps"]
    assert t["move_time_s"] <= 7200
    assert "wrote 18 tables" in report.stderr  # 14 + the 4 per-minute tables (client, topic, throttle, lines)


def test_report_renders_in_headless_chromium(report: Report, tmp_path: Path) -> None:
    page = report.out / "report.html"
    shot = tmp_path / "report.png"
    done = chromium(f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", page.as_uri(),
                    user_data=tmp_path / "profile")
    assert shot.is_file(), done.stderr[-2000:]
    with Image.open(shot) as im:
        assert im.size == WINDOW
        rgb = im.convert("RGB")
        colours = [(n, c) for n, c in rgb.getcolors(1 << 20) or [] if isinstance(c, tuple)]  # RGB: never a float
        assert len(colours) > 1000  # text, tables and anti-aliased charts; a blank or error page has a few
        white = sum(n for n, c in colours if min(c) >= 250)
        assert white < 0.9 * WINDOW[0] * WINDOW[1]
        chart_pixels = sum(n for n, c in colours
                           if any(all(abs(a - b) <= 12 for a, b in zip(c, blue, strict=True)) for blue in CHART_BLUES))
        assert chart_pixels > 2000, "no chart colours in the screenshot"

    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
    dom = chromium("--virtual-time-budget=10000", "--dump-dom", probe.as_uri(), user_data=tmp_path / "profile2")
    marker = '<pre id="probe">'
    assert marker in dom.stdout, dom.stderr[-2000:]
    result = json.loads(dom.stdout.split(marker, 1)[1].split("</pre>", 1)[0])
    assert result["images"] >= 14
    assert result["decoded"] == result["images"]  # every chart decoded and laid out by the browser
    assert result["smallest"] >= 800
