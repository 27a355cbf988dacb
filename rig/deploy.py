"""The Kubernetes deployment files (deploy/): the Helm chart, the plain manifests rendered from it, and the tools that
check them offline.

- ``helm`` and ``sluice-kubecheck`` are what ``make install`` puts in the venv's bin (Helm from the Go module
  proxy, pinned; the checker built from rig/go/kubecheck): :func:`tool` finds them there, and a missing one is an
  error naming the install step, never a skip.
- :data:`RENDERINGS`: each plain manifest in deploy/kubernetes/ and the chart values it is rendered with.
  ``python -m rig.deploy`` writes them; tests/unit/test_deploy.py holds them equal to the chart's rendering, so the
  plain manifests never drift from the chart.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "sluice"
MANIFESTS = REPO / "deploy" / "kubernetes"
RELEASE = "orders"  # the release name of the plain manifests: objects are named orders-sluice

#: file in deploy/kubernetes/ -> (what it is, the ``helm template`` arguments it is rendered with)
RENDERINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sidecar-native.yaml": (
        "an application with Sluice as a native sidecar (init container, restartPolicy: Always; Kubernetes 1.29+)",
        ("--set", "sidecar.native=true"),
    ),
    "sidecar-container.yaml": (
        "an application with Sluice as a plain second container (any Kubernetes; preStop waits for the application)",
        ("--set", "sidecar.native=false"),
    ),
    "broker-side.yaml": (
        "Sluice in each Kafka broker's pod for replication throttles (StatefulSet, headless Service, ServiceMonitor)",
        ("--set", "mode=broker", "--set", "workload.kind=StatefulSet", "--set", "workload.replicas=3",
         "--set", "upstream.bootstrapServers={localhost:9092}", "--set", "metrics.serviceMonitor.enabled=true",
         "--set-json", 'app.containers=[{"name":"kafka","image":"apache/kafka:4.3.1",'
                       '"ports":[{"name":"clients","containerPort":9092},{"name":"replication","containerPort":9094}]}]',
         "--set-string", "config=[throttle]\nleader_rate_bytes = 10000000\n[[throttle.topics]]\ntopic = \"*\"\n"),
    ),
}


class DeployError(RuntimeError):
    """A tool is missing or failed; the message says which and why."""


def tool(name: str) -> Path:
    """``helm`` or ``sluice-kubecheck`` from the venv's bin, where ``make install`` puts them."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise DeployError(f"{path} not found: `make install` installs it (Helm from the Go module proxy, "
                          "sluice-kubecheck built from rig/go/kubecheck)")
    return path


def helm(*args: str, timeout: float = 60) -> str:
    proc = subprocess.run([str(tool("helm")), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise DeployError(f"helm {' '.join(args[:2])} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def template(*args: str, release: str = RELEASE) -> str:
    """``helm template`` of the chart with ``args`` (values), as YAML."""
    return helm("template", release, str(CHART), *args)


def rendering(name: str) -> str:
    """The text deploy/kubernetes/``name`` must hold: a header saying where it comes from, then the rendering."""
    what, args = RENDERINGS[name]
    header = (f"# {what}.\n# Rendered from the Helm chart deploy/helm/sluice by `python -m rig.deploy` "
              "(tests/unit/test_deploy.py\n# checks it is current): change the chart or rig/deploy.py, not this "
              "file. Replace the example\n# application container, the image and upstream.bootstrapServers with "
              "yours.\n")
    return header + template(*args)


def kubecheck(paths: Sequence[Path]) -> str:
    """sluice-kubecheck over ``paths``: its summary line; DeployError with every problem it found."""
    proc = subprocess.run([str(tool("sluice-kubecheck")), *map(str, paths)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise DeployError(f"sluice-kubecheck: {proc.stderr.strip()} {proc.stdout.strip()}")
    return proc.stdout.strip()


def main() -> int:
    for name in RENDERINGS:
        (MANIFESTS / name).write_text(rendering(name))
        print(f"wrote {MANIFESTS / name}")
    print(kubecheck([MANIFESTS / name for name in RENDERINGS]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
