"""The Helm chart's pod, run for real with ``podman kube play`` (a step of ``make test-image``, rig/image.py).

1. ``helm lint --strict`` of deploy/helm/sluice; every plain manifest (deploy/kubernetes/) and the ServiceMonitor
   form checked offline by sluice-kubecheck (rig/deploy.py): Podman 4.3 cannot run a native sidecar (it runs init
   containers to completion first) nor a ServiceMonitor, so those are checked against the API's types only.
2. A Kafka broker pod (the apache/kafka image of docker-compose.yml) on a Podman network with DNS, one listener
   for pods (advertised as the pod's name) and one published on the host for the checks.
3. ``helm template`` of the chart as the plain two-container form, the application being rig/example_app.py in
   the Sluice image: it creates its topic, produces RECORDS records and consumes them through Sluice at localhost,
   committing after each batch.
4. Once the application has committed part of them, the pod is stopped as the kubelet stops one: both containers
   signalled at once with the chart's grace period (``podman stop``), then the pod and its network (``podman pod
   stop``): Sluice drains, the application finishes the batch in hand and exits.
5. Checked from the host, straight at the broker: the group's committed offset is where the application says it
   stopped; every record below it was consumed once, in order; every record from it on is still there to read
   (nothing lost); both containers exited 0 and Sluice logged its drain with no request abandoned.
6. Both pods removed (``podman kube down``), also on failure.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rig.deploy import CHART, MANIFESTS, RENDERINGS, DeployError, helm, kubecheck, template
from rig.image import SLUICE_IMAGE, ImageTestError, app_events, compose_images, run
from rig.kafka import free_ports

NETWORK = "sluice-kube"
BROKER_POD = "sluice-kafka"
RELEASE = "podtest"
RECORDS = 2000
STOP_AFTER = 200  # committed records before the pod is stopped: mid-way through RECORDS
WORK_S = 0.1  # the application's work per batch of 20
# Once it has committed STOP_AFTER records, the application's work on its next batch lasts until it is stopped
# (rig/example_app.py HOLD_AT): the stop lands mid-way, a batch in hand, however long the stop takes to come. A pace
# alone (RECORDS at WORK_S a batch, >= 10 s) raced the stop: CI's loaded machine once saw all 2000 consumed first
APP = Path(__file__).resolve().parent / "example_app.py"


def broker_pod(image: str, host_port: int) -> str:
    """A single-node KRaft broker as a Kubernetes Pod: PLAINTEXT for pods (advertised as the pod's DNS name on the
    Podman network), HOST published on 127.0.0.1:``host_port`` for the checks."""
    env = {
        "KAFKA_NODE_ID": "1", "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093,HOST://:9094",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{BROKER_POD}:9092,HOST://127.0.0.1:{host_port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,HOST:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1", "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1", "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": BROKER_POD},
        "spec": {"containers": [{
            "name": "kafka", "image": image, "env": [{"name": k, "value": v} for k, v in env.items()],
            "ports": [{"containerPort": 9092}, {"containerPort": 9094, "hostPort": host_port, "hostIP": "127.0.0.1"}],
        }]},
    }  # fmt: skip
    return json.dumps(pod)  # JSON is YAML


def app_values(topic: str, group: str) -> dict[str, Any]:
    """The chart's values for the test: the plain two-container form, the image just built, the broker pod."""
    return {
        "sidecar": {"native": False},
        "image": {"repository": f"localhost/{SLUICE_IMAGE.split(':')[0]}", "tag": SLUICE_IMAGE.split(":")[1]},
        "upstream": {"bootstrapServers": [f"{BROKER_POD}:9092"]},
        "shutdown": {"drainTimeoutSeconds": 10, "preStopSleepSeconds": 3},
        "app": {"containers": [{
            "name": "app", "image": f"localhost/{SLUICE_IMAGE}", "command": ["python", "-c", APP.read_text()],
            "env": [{"name": "TOPIC", "value": topic}, {"name": "GROUP", "value": group},
                    {"name": "RECORDS", "value": str(RECORDS)}, {"name": "WORK_S", "value": str(WORK_S)},
                    {"name": "HOLD_AT", "value": str(STOP_AFTER)}],
        }]},
    }  # fmt: skip




def poll(what: str, probe: Callable[[], str | None], timeout: float, interval: float = 0.3) -> None:
    """Poll ``probe`` (None = done, else why not yet) until done or ``timeout`` (then ImageTestError)."""
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    while True:
        why = probe()
        if why is None:
            print(f"{what}: after {time.monotonic() - t0:.1f}s", flush=True)
            return
        if time.monotonic() >= deadline:
            raise ImageTestError(f"{what}: not after {timeout:.0f}s ({why})")
        time.sleep(interval)


def pod_containers(env: Mapping[str, str], pod_prefix: str) -> dict[str, dict[str, Any]]:
    """{container name without the pod prefix: its podman inspect} of the pod whose name starts with the prefix."""
    proc = run(["podman", "ps", "-a", "--pod", "--format", "json"], env=env, capture=True, quiet=True)
    out = {}
    for c in json.loads(proc.stdout or "[]"):
        pod = c.get("PodName") or ""
        name = c["Names"][0]
        if pod.startswith(pod_prefix) and not name.endswith("-infra"):
            out[name.removeprefix(pod + "-")] = c
    return out


@contextlib.contextmanager
def played(env: Mapping[str, str], path: Path) -> Iterator[None]:
    run(["podman", "kube", "play", "--network", NETWORK, str(path)], env=env, timeout=180)
    try:
        yield
    finally:
        run(["podman", "kube", "down", str(path)], env=env, check=False, timeout=120)


def check_offline() -> None:
    print(helm("lint", "--strict", str(CHART)).strip().splitlines()[-1])
    for name in RENDERINGS:
        if not (MANIFESTS / name).exists():
            raise ImageTestError(f"deploy/kubernetes/{name} is missing: python -m rig.deploy writes it")
    print("offline, against the Kubernetes API's types (sluice-kubecheck): "
          + kubecheck([MANIFESTS / name for name in RENDERINGS]))


def run_pod_test(env: Mapping[str, str]) -> None:
    """Steps 1-6 above; ImageTestError naming what failed."""
    try:
        check_offline()
        _run(env)
    except DeployError as exc:
        raise ImageTestError(str(exc)) from exc


def _run(env: Mapping[str, str]) -> None:
    kafka_image = compose_images()["kafka"]
    if run(["podman", "network", "exists", NETWORK], env=env, check=False, quiet=True).returncode != 0:
        run(["podman", "network", "create", NETWORK], env=env)
    host_port = free_ports(1)[0]  # from the session's range (Makefile PORTS_IMAGE), not the ephemeral one
    topic, group = f"pod-{uuid.uuid4().hex[:8]}", "pod-app"
    with tempfile.TemporaryDirectory(prefix="sluice-pod-") as tmp:
        work = Path(tmp)
        (work / "kafka.yaml").write_text(broker_pod(kafka_image, host_port))
        (work / "values.json").write_text(json.dumps(app_values(topic, group)))
        (work / "app.yaml").write_text(template("-f", str(work / "values.json"), release=RELEASE))
        with played(env, work / "kafka.yaml"):
            bootstrap = f"127.0.0.1:{host_port}"
            poll("the broker pod answers", lambda: _broker_answers(bootstrap), timeout=120)
            with played(env, work / "app.yaml"):
                containers = pod_containers(env, RELEASE)
                if set(containers) != {"app", "sluice"}:
                    raise ImageTestError(f"the pod's containers are {sorted(containers)}, not app and sluice")
                try:
                    _stop_mid_way(env, containers, bootstrap, topic, group, work / "app.yaml")
                except ImageTestError:
                    for c in containers.values():
                        print(f"\n--- {c['Names'][0]}: last 40 log lines ---", flush=True)
                        run(["podman", "logs", "--tail", "40", c["Names"][0]], env=env, check=False, quiet=True)
                    print("\n--- the broker: last 20 log lines ---", flush=True)
                    run(["podman", "logs", "--timestamps", "--tail", "20", f"{BROKER_POD}-kafka"], env=env,
                        check=False, quiet=True)
                    raise


def _stop_mid_way(env: Mapping[str, str], containers: Mapping[str, Mapping[str, Any]], bootstrap: str, topic: str,
                  group: str, rendered: Path) -> None:
    app = containers["app"]["Names"][0]
    pod = containers["app"]["PodName"]
    poll(f"the application committed {STOP_AFTER} records through Sluice",
         lambda: _committed_at_least(env, app, STOP_AFTER), timeout=180)
    t0 = time.monotonic()
    grace = _grace_period(rendered)
    # As the kubelet stops a pod: every container is signalled at once and given the grace period, and the pod's
    # network goes only once they have all exited. `podman pod stop` stops the infra container (the network
    # namespace's holder) alongside them, so Sluice's upstream connection could vanish mid-drain, its last
    # request forwarded and never answered (seen: an OffsetCommit, a LeaveGroup the broker's log never shows,
    # each abandoned at the drain timeout). So the two containers are stopped first, then the pod.
    run(["podman", "stop", "-t", str(grace), app, f"{pod}-sluice"], env=env, timeout=grace + 60)
    print(f"the pod's containers stopped in {time.monotonic() - t0:.1f}s (grace period {grace}s)")
    run(["podman", "pod", "stop", pod], env=env, timeout=60)
    _check_stopped(env, pod, app, bootstrap, topic, group)


def _broker_answers(bootstrap: str) -> str | None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    except KafkaError as exc:
        return f"{type(exc).__name__}: {exc}"
    admin.close()
    return None


def _committed_at_least(env: Mapping[str, str], app: str, offset: int) -> str | None:
    events = app_events(env, app)
    failed = [e for e in events if e["event"] in ("failed", "stopped")]
    if failed:
        raise ImageTestError(f"the application stopped on its own: {failed[0]}")
    committed = [e["offset"] for e in events if e["event"] == "committed"]
    return None if committed and committed[-1] >= offset else f"committed {committed[-1:]}"


def _grace_period(rendered: Path) -> int:
    for line in rendered.read_text().splitlines():
        if line.strip().startswith("terminationGracePeriodSeconds:"):
            return int(line.split(":")[1])
    raise ImageTestError("the rendered pod has no terminationGracePeriodSeconds")


def _exit_code(env: Mapping[str, str], container: str) -> int:
    proc = run(["podman", "inspect", "--format", "{{.State.ExitCode}}", container], env=env, capture=True,
               quiet=True)
    return int(proc.stdout.strip())


def _check_stopped(env: Mapping[str, str], pod: str, app: str, bootstrap: str, topic: str, group: str) -> None:
    sluice = f"{pod}-sluice"
    stopped = [e for e in app_events(env, app) if e["event"] == "stopped"]
    if not stopped:
        raise ImageTestError(f"the application did not say where it stopped: {app_events(env, app)[-3:]}")
    position = stopped[-1]["position"]
    if not stopped[-1]["in_order"]:
        raise ImageTestError("the application read records out of order or changed")
    if not STOP_AFTER <= position < RECORDS:
        raise ImageTestError(f"the stop did not land mid-way: the application stopped at {position} of {RECORDS}")
    codes = {"app": _exit_code(env, app), "sluice": _exit_code(env, sluice)}
    if codes != {"app": 0, "sluice": 0}:
        raise ImageTestError(f"exit codes after the stop: {codes}")
    log = run(["podman", "logs", sluice], env=env, capture=True, quiet=True)
    events = [json.loads(line) for line in (log.stdout + log.stderr).splitlines() if line.startswith("{")]
    drained = [e for e in events if e.get("event") == "stopped"]
    if not any(e.get("event") == "shutting_down" for e in events) or not drained:
        raise ImageTestError("Sluice's log shows no drain (shutting_down, then stopped)")
    if drained[-1].get("abandoned_requests") != 0:
        raise ImageTestError(f"Sluice abandoned requests at its stop: {drained[-1]}")
    committed, rest = _after_the_stop(bootstrap, topic, group, position)
    if committed != position:
        raise ImageTestError(f"the group's committed offset is {committed}, the application stopped at {position}")
    expected = [b"record-%06d" % i for i in range(position, RECORDS)]
    if rest != expected:
        raise ImageTestError(f"after the committed offset {position}: {len(rest)} records, expected "
                             f"{len(expected)} ({rest[:2]}...)")
    print(f"stopped mid-way at offset {position} of {RECORDS}: committed there, records {position}.. all still "
          f"there, Sluice drained ({drained[-1]}), both containers exited 0")


def _after_the_stop(bootstrap: str, topic: str, group: str, start: int) -> tuple[int | None, list[bytes]]:
    """The group's committed offset, and every record from ``start`` to the end of the topic."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    # in the group only to read its commit (OffsetFetch): it never subscribes, so it never joins
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    rest: list[bytes] = []
    try:
        committed = consumer.committed(tp)
        consumer.assign([tp])
        consumer.seek(tp, start)
        end = consumer.end_offsets([tp])[tp]
        deadline = time.monotonic() + 60
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                rest.extend(r.value for r in batch)
    finally:
        consumer.close()
    return committed, rest


if __name__ == "__main__":  # the pod test alone, on the images make test-image built and cached
    from rig.image import cache_root, podman_env

    try:
        run_pod_test(podman_env(cache_root() / "podman"))
    except ImageTestError as exc:
        raise SystemExit(f"FAILED: {exc}") from None
