"""SASL relayed untouched and seen: Java, confluent-kafka and kafka-python authenticate through Sluice (PLAIN and
SCRAM-SHA-512, over SASL_PLAINTEXT and SASL_SSL) against the real broker (rig/secure_broker.py), and every
record arrives once, in order, unchanged; the principal is in the access log and selects a size limit; a wrong
password fails as it does directly; KIP-368 re-authentication passes through; no password reaches a log line or
/metrics."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from kafka import KafkaConsumer
from structlog.testing import capture_logs

from proxy.core.sasl_client import SaslClientError
from rig.java_tools import JavaTools
from rig.pki import CA
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from rig.secure_broker import SASL_USERS, SecureBroker, create_scram_user
from tests.support.consume import consume_values

RECORDS = 120
VALUES = [f"v{i:04d}-".encode() + b"x" * 90 for i in range(RECORDS)]
WRONG = "not-the-password-93xq"
SVC_PASSWORD = "svc-pw-Lm55"  # Sluice's own identity ([upstream.sasl])
BUDGET = 2048  # alice's fetch budget: far below one fetch of the topic

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def topic(secure_broker: SecureBroker) -> str:
    name = f"sasl-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": secure_broker.plaintext, "linger.ms": 0, "log_level": 0})
    for v in VALUES:
        producer.produce(name, v)
        assert producer.flush(30) == 0  # one batch per record: the budget can cut between any two
    return name


@pytest.fixture(scope="module")
def sluice_pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ca = CA(tmp_path_factory.mktemp("sasl-pki"), "sluice-sasl")
    return {"ca": ca, "server": ca.issue("server")}


class Sluices:
    """One Sluice in front of each SASL listener, with the access log in a file and a budget for alice."""

    def __init__(self, broker: SecureBroker, pki: dict[str, Any], directory: Path) -> None:
        common = {"size_limit.budgets": [{"principal": "alice", "fetch_max_bytes": BUDGET,
                                          "partition_max_bytes": BUDGET}]}
        self.plain_log = directory / "plaintext.log"
        self.ssl_log = directory / "ssl.log"
        self.plaintext = ProxyThread(broker.sasl_plaintext, **common, **{"logging.access_log": str(self.plain_log)})
        self.ssl = ProxyThread(broker.sasl_ssl, **common, **{
            "logging.access_log": str(self.ssl_log),
            "listen.tls.enabled": True, "listen.tls.cert_file": str(pki["server"].cert),
            "listen.tls.key_file": str(pki["server"].key),
            "upstream.tls.enabled": True, "upstream.tls.ca_file": str(broker.ca.cert)})
        self.ca = pki["ca"].cert

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for sluice, path in ((self.plaintext, self.plain_log), (self.ssl, self.ssl_log)):
            sluice.call(_flush(sluice))
            out += [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        return out

    def close(self) -> None:
        self.plaintext.stop()
        self.ssl.stop()


async def _flush(sluice: ProxyThread) -> None:
    sluice.proxy.access_log.flush()


@pytest.fixture(scope="module")
def events() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every operational log event of the module's Sluices (kept for the secrets check)."""
    with capture_logs() as captured:
        yield captured


@pytest.fixture(scope="module")
def sluices(secure_broker: SecureBroker, sluice_pki: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
            events: list[MutableMapping[str, Any]]) -> Iterator[Sluices]:
    s = Sluices(secure_broker, sluice_pki, tmp_path_factory.mktemp("sasl-logs"))
    yield s
    s.close()


def rdkafka_conf(sluices: Sluices, tls: bool, mechanism: str, user: str, password: str) -> dict[str, Any]:
    sluice = sluices.ssl if tls else sluices.plaintext
    conf = {"bootstrap.servers": sluice.bootstrap, "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "log_level": 0}
    if mechanism == "OAUTHBEARER":
        # librdkafka's built-in unsecured JWT (KIP-255's default on the broker: unsigned, "sub" is the principal)
        conf.update({"enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": f"principal={user}"})
    else:
        conf.update({"sasl.username": user, "sasl.password": password})
    if tls:
        conf["ssl.ca.location"] = str(sluices.ca)
    return conf


def principals_of(lines: list[dict[str, Any]], client_id: str, api: str) -> set[str | None]:
    return {ln.get("principal") for ln in lines if ln["client_id"] == client_id and ln["api"] == api}


def principals(lines: list[dict[str, Any]], client_id: str) -> set[str | None]:
    return principals_of(lines, client_id, "Fetch")


@pytest.mark.parametrize(("tls", "mechanism", "user"), [(False, "PLAIN", "bob"), (True, "SCRAM-SHA-512", "bob"),
                                                        (False, "SCRAM-SHA-512", "alice"),
                                                        (True, "OAUTHBEARER", "carol"),
                                                        (False, "SCRAM-SHA-256", "bob")])
def test_confluent_kafka_authenticates_through_sluice(sluices: Sluices, topic: str, tls: bool, mechanism: str,
                                                      user: str) -> None:
    client_id = f"rdkafka-{mechanism}-{tls:d}-{user}"
    conf = {**rdkafka_conf(sluices, tls, mechanism, user, SASL_USERS.get(user, "")), "client.id": client_id}
    assert consume_values(conf, topic) == VALUES
    lines = sluices.lines()
    assert principals(lines, client_id) == {user}
    # The budget is alice's: every response to her fetches stays within it (headers aside), while bob's first
    # fetch carries far more of the topic than that.
    largest = max(ln["bytes_proxy_to_client"] for ln in lines if ln["client_id"] == client_id and ln["api"] == "Fetch")
    assert (largest <= BUDGET + 512) == (user == "alice"), largest


def test_kafka_python_authenticates_through_sluice(sluices: Sluices, topic: str) -> None:
    for mechanism, user in (("SCRAM-SHA-512", "alice"), ("PLAIN", "bob")):
        client_id = f"kafka-python-{mechanism}"
        consumer = KafkaConsumer(topic, bootstrap_servers=sluices.plaintext.bootstrap, client_id=client_id,
                                 security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                                 sasl_plain_username=user, sasl_plain_password=SASL_USERS[user],
                                 auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=20000)
        try:
            got = _take(consumer, RECORDS)
        finally:
            consumer.close()
        assert got == VALUES
        assert principals(sluices.lines(), client_id) == {user}


async def test_aiokafka_negotiates_handshake_v1_through_sluice(sluices: Sluices, topic: str) -> None:
    """aiokafka picks SaslHandshake's version from ApiVersions (Sluice offers v1 only) and authenticates."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=sluices.plaintext.bootstrap, client_id="aiokafka-scram",
                                security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                                sasl_plain_username="alice", sasl_plain_password=SASL_USERS["alice"],
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < RECORDS and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            got += [m.value for m in batch.get(tp, []) if m.value is not None]
    finally:
        await consumer.stop()
    assert got == VALUES
    assert principals(sluices.lines(), "aiokafka-scram") == {"alice"}


def _take(consumer: KafkaConsumer, n: int) -> list[bytes]:
    out: list[bytes] = []
    for message in consumer:  # consumer_timeout_ms bounds the wait
        out.append(message.value)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize(("tls", "mechanism"), [(False, "PLAIN"), (True, "SCRAM-SHA-512")])
def test_java_authenticates_through_sluice(sluices: Sluices, topic: str, java_tools: JavaTools, tls: bool,
                                           mechanism: str) -> None:
    sluice = sluices.ssl if tls else sluices.plaintext
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    props: dict[str, object] = {
        "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
        "sasl.jaas.config": f'org.apache.kafka.common.security.{module} required username="bob" '
                            f'password="{SASL_USERS["bob"]}";',
        "client.id": f"java-{mechanism}"}
    if tls:
        props.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(sluices.ca)})
    lines = java_tools.console_consume(sluice.bootstrap, topic, max_messages=RECORDS, consumer_props=props,
                                       idle_timeout_ms=20_000)
    assert [ln.encode() for ln in lines] == VALUES
    assert principals(sluices.lines(), f"java-{mechanism}") == {"bob"}


def test_wrong_password_fails_as_it_does_directly(sluices: Sluices, secure_broker: SecureBroker) -> None:
    def auth_error(bootstrap: str) -> str:
        errors: list[KafkaError] = []
        producer = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": WRONG,
                             "error_cb": errors.append, "log_level": 0})
        deadline = time.monotonic() + 30
        while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
            producer.poll(0.2)
        del producer
        [first] = [e for e in errors if e.code() == KafkaError._AUTHENTICATION][:1]
        # the broker's own words, without the address and librdkafka's timing suffix
        return re.sub(r" \(after \d+ms.*\)$", "", first.str().split(": ", 1)[-1] if ": " in first.str() else "")

    direct = auth_error(secure_broker.sasl_plaintext)
    through = auth_error(sluices.plaintext.bootstrap)
    assert "Authentication failed" in direct
    assert through == direct


def test_reauthentication_kip_368_passes_through(sluices: Sluices, secure_broker: SecureBroker) -> None:
    """The broker's SASL sessions last 4 s: a consumer kept open longer re-authenticates on its connections and
    goes on consuming. On a topic of its own: the module's topic holds exactly VALUES for the tests that read it
    whole."""
    sluice = sluices.plaintext
    conf = {**rdkafka_conf(sluices, False, "SCRAM-SHA-512", "bob", SASL_USERS["bob"]), "client.id": "reauth"}
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "latest",
                         "enable.auto.commit": False})
    topic = f"sasl-reauth-{uuid.uuid4().hex[:8]}"
    first = Producer({"bootstrap.servers": secure_broker.plaintext, "log_level": 0})
    first.produce(topic, b"created")  # the topic exists before the consumer's "latest" is resolved
    assert first.flush(30) == 0
    later = f"reauth-{uuid.uuid4().hex[:6]}".encode()
    try:
        consumer.subscribe([topic])
        start = time.monotonic()
        before = sluice.total("sluice_sasl_authentications_total")
        got: list[bytes] = []
        produced = False
        while time.monotonic() - start < 40 and later not in got:
            msg = consumer.poll(0.2)
            value = None if msg is None or msg.error() else msg.value()
            if value is not None:
                got.append(value)
            if not produced and time.monotonic() - start > 10:  # well past two session lifetimes
                p = Producer({"bootstrap.servers": secure_broker.plaintext, "log_level": 0})
                p.produce(topic, later)
                assert p.flush(10) == 0
                produced = True
        connections = {ln["conn_id"] for ln in sluices.lines() if ln["client_id"] == "reauth"}
        assert later in got
        assert sluice.total("sluice_sasl_authentications_total") - before > len(connections)  # re-authenticated
    finally:
        consumer.close()


def test_sluice_own_identity_names_topics_and_a_throttle_selects_a_principal(
        secure_broker: SecureBroker, topic: str, java_tools: JavaTools, tmp_path: Path) -> None:
    """Behind a SASL listener Sluice's own lookups (brokers at start, topic names for Fetch v13+) authenticate
    with [upstream.sasl] (SCRAM-SHA-512, its password from a file), so a throttle keyed on a principal applies
    to the Java consumer's Fetch v17 by topic name: alice's fetches are metered, bob's are not. The lookups come
    after the SASL session of Sluice's login at start has expired (the broker bounds it, KIP-368): they open a
    connection of their own rather than fail on the expired one (and leave the topic unnamed, so unthrottled)."""
    create_scram_user(secure_broker.plaintext, "sluice-svc", SVC_PASSWORD, ("SCRAM-SHA-512",))
    password_file = tmp_path / "sasl-password"
    password_file.write_text(SVC_PASSWORD + "\n")
    with ProxyThread(secure_broker.sasl_plaintext, **{
            "upstream.sasl.mechanism": "SCRAM-SHA-512", "upstream.sasl.username": "sluice-svc",
            "upstream.sasl.password_file": str(password_file),
            "throttle.leader_rate_bytes": 200_000, "throttle.topics": [{"topic": topic}],
            "throttle.consumers": [{"principal": "alice"}]}) as sluice:
        assert sluice.proxy.router.upstream  # the brokers were learnt at start, through Sluice's own login
        # Not a synchronisation: the session of that login must outlive its lifetime, which only time does (the
        # consumers' JVMs start in less than it on a quiet machine, more on a loaded one)
        time.sleep(secure_broker.reauth_ms / 1000)
        metered = []
        for user in ("bob", "alice"):
            props: dict[str, object] = {
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.jaas.config": f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                    f'username="{user}" password="{SASL_USERS[user]}";'}
            lines = java_tools.console_consume(sluice.bootstrap, topic, max_messages=RECORDS, consumer_props=props)
            assert [ln.encode() for ln in lines] == VALUES
            metered.append(sluice.total("sluice_throttle_bytes_total", side="leader"))
        assert metered[0] == 0 and metered[1] > 0  # bob's fetches were not throttled, alice's were
        assert sluice.total("sluice_topic_name_lookups_total", outcome="resolved") >= 1
        assert sluice.total("sluice_topic_name_lookups_total", outcome="failed") == 0


def bare_v0_login(c: RawClient, mechanism: str, user: str, password: str) -> None:
    """SaslHandshake v0, then the tokens in bare frames (before KIP-152), as kafka-python 2.0.2 and old Sarama
    do it, with Sluice's own SASL client for the mechanism's messages."""
    from proxy.core.sasl_client import SaslClient
    from proxy.wire.model import Message

    assert c.request(17, 0, Message(mechanism=mechanism)).error_code == 0
    client = SaslClient(mechanism, user, password)
    token: bytes | None = client.first()
    while token is not None:
        c.sock.sendall(len(token).to_bytes(4, "big") + token)
        token = client.next(c.receive())


@pytest.mark.parametrize(("mechanism", "user"), [("PLAIN", "alice"), ("SCRAM-SHA-512", "bob")])
def test_handshake_v0_bare_tokens_pass_through(sluices: Sluices, secure_broker: SecureBroker, mechanism: str,
                                               user: str) -> None:
    """Kafka 4.1 still takes SaslHandshake v0: a v0 client logs in directly and through Sluice alike, then
    speaks Kafka requests on the same connection; Sluice names it; a wrong password is refused either way."""
    from proxy.wire.messages import request_codec

    metadata = request_codec(3, 12).default().replace(topics=[], allow_auto_topic_creation=False)
    for bootstrap in (secure_broker.sasl_plaintext, sluices.plaintext.bootstrap):
        host, port = bootstrap.rsplit(":", 1)
        with RawClient(host, int(port), client_id=f"v0-{mechanism}") as c:
            bare_v0_login(c, mechanism, user, SASL_USERS[user])
            assert c.request(3, 12, metadata).brokers
        with RawClient(host, int(port), client_id=f"v0-{mechanism}-wrong") as c, \
                pytest.raises((ConnectionError, OSError, SaslClientError)):
            bare_v0_login(c, mechanism, user, WRONG)
            c.request(3, 12, metadata)
    assert principals_of(sluices.lines(), f"v0-{mechanism}", "Metadata") == {user}


SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_readme_tls_sasl_example_loads_and_runs(secure_broker: SecureBroker, sluice_pki: dict[str, Any],
                                                topic: str, tmp_path: Path) -> None:
    """The security page's TLS + SASL example (docs/security.md), its paths pointed at files made here: it loads as
    written, and with the addresses of this machine it serves a SASL_SSL client through TLS to the broker's SASL_SSL
    listener."""
    import shutil
    import tomllib

    from proxy.app import load_settings

    example = SECURITY.read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    example = example.replace("/etc/sluice/", f"{tmp_path}/")
    (tmp_path / "tls").mkdir()
    (tmp_path / "secrets").mkdir()
    shutil.copy(secure_broker.ca.cert, tmp_path / "tls" / "kafka-ca.pem")
    shutil.copy(sluice_pki["server"].cert, tmp_path / "tls" / "sluice.pem")
    shutil.copy(sluice_pki["server"].key, tmp_path / "tls" / "sluice.key")
    (tmp_path / "secrets" / "sasl-password").write_text(SVC_PASSWORD + "\n")
    (tmp_path / "secrets" / "admin-token").write_text("readme-admin-token\n")
    config = tmp_path / "sluice.toml"
    config.write_text(example)
    settings = load_settings(config, env={})
    assert settings.listen.tls.enabled and settings.upstream.tls.check_hostname
    assert settings.upstream.sasl.mechanism == "SCRAM-SHA-512" and settings.admin.bearer_token() == "readme-admin-token"
    assert settings.size_limit.budgets[0].principal == "analytics-*"

    create_scram_user(secure_broker.plaintext, "sluice", SVC_PASSWORD, ("SCRAM-SHA-512",))
    overrides = _flatten(tomllib.loads(example))
    overrides.update({"upstream.bootstrap_servers": [secure_broker.sasl_ssl], "listen.host": "127.0.0.1",
                      "listen.advertised_host": "127.0.0.1", "listen.proxy_protocol": "off"})
    with ProxyThread(secure_broker.sasl_ssl, **overrides) as sluice:
        assert sluice.proxy.router.upstream  # Sluice's own SCRAM login found the brokers at start
        conf = {"bootstrap.servers": sluice.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                "sasl.username": "alice", "sasl.password": SASL_USERS["alice"],
                "ssl.ca.location": str(sluice_pki["ca"].cert), "log_level": 0}
        assert consume_values(conf, topic) == VALUES


def test_no_secret_reaches_a_log_line_or_metrics(sluices: Sluices, events: list[MutableMapping[str, Any]],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Runs last in the module: after every authentication above, good and bad."""
    secrets = [*SASL_USERS.values(), WRONG, SVC_PASSWORD]
    texts = [repr(e) for e in events]
    texts += [r.getMessage() for r in caplog.records] + [logging.Formatter().format(r) for r in caplog.records]
    texts += [sluices.plain_log.read_text(), sluices.ssl_log.read_text()]
    texts += [s.proxy.metrics.exposition().decode() for s in (sluices.plaintext, sluices.ssl)]
    assert any("sasl_authenticated" in t for t in texts)  # the log was there to look at
    for secret in secrets:
        assert not [t for t in texts if secret in t], f"{secret!r} leaked"
