"""The Helm chart and the plain manifests (deploy/), rendered with the Helm make install pins and checked offline.

The pod itself runs under Podman in ``make test-image`` (rig/kube_pod.py); here: the chart lints, each plain
manifest is exactly the chart's rendering, every rendering passes sluice-kubecheck (the Kubernetes API's types,
strictly), and the settings a sidecar's life depends on hold in each form.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rig.deploy import CHART, MANIFESTS, RENDERINGS, DeployError, helm, kubecheck, rendering, template


def _sluice(rendered: str) -> str:
    """The Sluice container's block of a rendered workload (up to the next container or the volumes)."""
    match = re.search(r"(?ms)^ {8}- name: sluice\n(.*?)(?=^ {8}- |^ {6}volumes:)", rendered)
    assert match, rendered
    return match.group(1)


def test_chart_lints_strictly() -> None:
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART))


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_plain_manifest_is_the_charts_rendering(name: str) -> None:
    assert (MANIFESTS / name).read_text() == rendering(name), f"run `python -m rig.deploy` to render {name} again"


def test_every_form_passes_the_api_types() -> None:
    # ConfigMap + Deployment twice; ConfigMap, headless Service, StatefulSet, ServiceMonitor
    assert kubecheck([MANIFESTS / name for name in RENDERINGS]) == "8 documents checked, 0 failed"


def test_the_checker_refuses_what_kubernetes_refuses(tmp_path: Path) -> None:
    """A misplaced field and a restartPolicy on an app container fail: the check is not a rubber stamp."""
    bad = (MANIFESTS / "sidecar-container.yaml").read_text()
    misplaced = tmp_path / "misplaced.yaml"
    misplaced.write_text(bad.replace("terminationGracePeriodSeconds:", "terminationGracePeriod:"))
    with pytest.raises(DeployError, match="unknown field"):
        kubecheck([misplaced])
    policy = tmp_path / "policy.yaml"
    sluice = "        - name: sluice\n"
    policy.write_text(bad.replace(sluice, sluice + "          restartPolicy: Always\n"))
    with pytest.raises(DeployError, match="only allowed on init containers"):
        kubecheck([policy])


def test_native_sidecar_is_an_init_container_restarting_always() -> None:
    rendered = template("--set", "sidecar.native=true")
    init, containers = rendered.split("      initContainers:\n")[1].split("      containers:\n")
    assert "- name: sluice" in init and "restartPolicy: Always" in _sluice(rendered)
    assert "- name: sluice\n" not in containers
    assert "preStop" not in _sluice(rendered)  # Kubernetes stops it after the application: nothing to wait for


def test_plain_container_waits_for_the_application_then_drains_within_the_grace_period() -> None:
    rendered = template("--set", "sidecar.native=false", "--set", "shutdown.preStopSleepSeconds=7",
                        "--set", "shutdown.drainTimeoutSeconds=12")
    sluice = _sluice(rendered)
    assert "initContainers" not in rendered and "restartPolicy" not in sluice
    assert "sleep: {seconds: 7}" in sluice
    assert re.search(r'SLUICE_SHUTDOWN__DRAIN_TIMEOUT_S\n\s+value: "12"', sluice)
    assert "terminationGracePeriodSeconds: 24" in rendered  # 7 + 12 + 5
    with pytest.raises(DeployError, match="must cover the preStop wait and the drain: at least 24"):
        template("--set", "sidecar.native=false", "--set", "shutdown.preStopSleepSeconds=7",
                 "--set", "shutdown.drainTimeoutSeconds=12", "--set", "shutdown.terminationGracePeriodSeconds=20")


def test_application_bootstraps_at_its_sidecar_and_probes_use_the_admin_port() -> None:
    rendered = template("--set", "listen.port=29092", "--set", "admin.port=9700")
    assert re.search(r"name: KAFKA_BOOTSTRAP_SERVERS\n\s+value: localhost:29092", rendered)
    sluice = _sluice(rendered)
    assert re.search(r'SLUICE_LISTEN__HOST\n\s+value: "127.0.0.1"', sluice)  # only the pod reaches it
    assert "readinessProbe:\n            httpGet: {path: /readyz, port: admin}" in sluice
    assert "livenessProbe:\n            httpGet: {path: /healthz, port: admin}" in sluice
    assert 'prometheus.io/port: "9700"' in rendered


def test_secrets_never_land_in_the_configmap_or_env_values() -> None:
    rendered = template("--set", "upstream.sasl.mechanism=SCRAM-SHA-512", "--set", "upstream.sasl.username=sluice",
                        "--set", "upstream.sasl.passwordSecret.name=kafka-sluice",
                        "--set", "admin.tokenSecret.name=adm",
                        "--set", "upstream.tls.enabled=true", "--set", "upstream.tls.secretName=kafka-ca")
    assert re.search(r"SLUICE_UPSTREAM__SASL__PASSWORD\n\s+valueFrom:\n\s+secretKeyRef: "
                     r'\{name: "kafka-sluice", key: "password"\}', rendered)
    assert re.search(r'SLUICE_ADMIN__TOKEN\n\s+valueFrom:\n\s+secretKeyRef: \{name: "adm", key: "token"\}', rendered)
    assert 'secret: {secretName: "kafka-ca"}' in rendered


def test_fleet_values_become_its_settings() -> None:
    rendered = template("--set", "fleet.enabled=true", "--set", "fleet.name=payments")
    assert re.search(r'SLUICE_FLEET__NAME\n\s+value: "payments"', rendered)
    assert re.search(r"SLUICE_FLEET__INSTANCE_ID\n\s+valueFrom: \{fieldRef: \{fieldPath: metadata.name\}\}", rendered)
    with pytest.raises(DeployError, match=r"fleet\.name is required"):
        template("--set", "fleet.enabled=true")


def test_config_values_reach_the_configmap_verbatim() -> None:
    rendered = template("--set-json", "config=" + json.dumps('[sessions]\nmode = "terminate"\n'))
    assert '    [sessions]\n    mode = "terminate"\n' in rendered
