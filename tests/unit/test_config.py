"""proxy.config: defaults, file + env precedence, validation messages, and the CLI's exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from proxy.app import Settings, load_settings
from proxy.config import ConfigError, parse_host_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "sluice.toml"


def write(tmp_path: Path, text: str, name: str = "sluice.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def clean_env() -> dict[str, str]:
    """The test process's environment without SLUICE_* variables, so overrides cannot leak into a test."""
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("SLUICE_")}


def sluice(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO,
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# ------------------------------------------------------------------------------------------------ defaults


def test_defaults() -> None:
    s = load_settings(None, env={})
    assert s.upstream.bootstrap_servers == ["127.0.0.1:9092"]
    assert s.upstream.connect_timeout_s == 10.0
    assert (s.listen.host, s.listen.bootstrap_port, s.listen.broker_port_base) == ("127.0.0.1", 19092, 19093)
    assert s.listen.advertised_host == "127.0.0.1"
    assert s.limits.max_frame_bytes == 104857600
    assert (s.limits.write_high_water_bytes, s.limits.write_low_water_bytes) == (4194304, 1048576)
    assert s.shutdown.drain_timeout_s == 10.0
    assert (s.admin.enabled, s.admin.host, s.admin.port, s.admin.token) == (True, "127.0.0.1", 9644, "")
    assert s.admin.state_file == ""  # admin API changes are not saved unless asked for
    assert (s.logging.level, s.logging.access_log, s.logging.format) == ("info", "-", "json")
    assert s == Settings()


def test_example_file_lists_every_key_with_its_default() -> None:
    # The commented example is documentation: it must parse, name every key, and agree with the code.
    assert load_settings(EXAMPLE, env={}) == Settings()
    with EXAMPLE.open("rb") as fh:
        example = tomllib.load(fh)
    assert {s: set(keys) for s, keys in example.items()} == {
        s: set(section) for s, section in Settings().model_dump().items()
    }


# ---------------------------------------------------------------------------------------------- precedence


def test_file_overrides_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [upstream]
        bootstrap_servers = ["kafka-1:9092", "[::1]:9093"]
        [listen]
        bootstrap_port = 29092
        broker_port_base = 29100
        [logging]
        level = "DEBUG"
        """,
    )
    s = load_settings(path, env={})
    assert s.upstream.addresses == [("kafka-1", 9092), ("::1", 9093)]
    assert (s.listen.bootstrap_port, s.listen.broker_port_base) == (29092, 29100)
    assert s.logging.level == "debug"  # case-insensitive, stored lower-case
    assert s.limits == Settings().limits  # untouched sections keep their defaults


def test_env_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[listen]\nbootstrap_port = 29092\n[upstream]\nbootstrap_servers = ["a:1"]\n')
    env = {
        "SLUICE_LISTEN__BOOTSTRAP_PORT": "0",
        "SLUICE_UPSTREAM__BOOTSTRAP_SERVERS": "127.0.0.1:9092, 127.0.0.1:9093",
        "SLUICE_UPSTREAM__CONNECT_TIMEOUT_S": "2.5",
        "SLUICE_ADMIN__ENABLED": "false",
        "SLUICE_ADMIN__TOKEN": "s3cret",
        "SLUICE_LOGGING__ACCESS_LOG": "off",
    }
    s = load_settings(path, env=env)
    assert s.listen.bootstrap_port == 0
    assert s.upstream.bootstrap_servers == ["127.0.0.1:9092", "127.0.0.1:9093"]
    assert s.upstream.connect_timeout_s == 2.5
    assert s.admin.enabled is False
    assert s.admin.token == "s3cret"
    assert s.logging.access_log == "off"


def test_env_none_means_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.upper().startswith("SLUICE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLUICE_ADMIN__PORT", "0")
    assert load_settings(None).admin.port == 0
    assert load_settings(None, env={}).admin.port == 9644


def test_sluice_variables_without_double_underscore_are_not_overrides() -> None:
    # SLUICE_CONFIG (the CLI's) and variables of rig/ or tests must not be mistaken for settings.
    s = load_settings(None, env={"SLUICE_CONFIG": "x.toml", "SLUICE_KAFKA_HOME": "/opt", "PATH": "/bin"})
    assert s == Settings()


# ---------------------------------------------------------------------------------------------- validation

# (file text, the dotted key the error must name, a fragment of the reason)
INVALID = [
    ("[listen]\nbootstrap_port = 70000", "listen.bootstrap_port", "at most 65535"),
    ("[listen]\nbootstrap_port = -1", "listen.bootstrap_port", "at least 0"),
    ('[listen]\nbootstrap_port = "19092"', "listen.bootstrap_port", "expected an integer"),
    ("[listen]\nbroker_port_base = 19000", "listen.broker_port_base", "above listen.bootstrap_port"),
    ('[listen]\nadvertised_host = "0.0.0.0"', "listen.advertised_host", "wildcard"),
    ('[listen]\nhost = ""', "listen.host", "non-empty"),
    ("[admin]\nport = 65536", "admin.port", "at most 65535"),
    ("[admin]\nport = 19092", "admin.port", "collides with listen.bootstrap_port"),
    ('[admin]\nenabled = "yes"', "admin.enabled", "expected a boolean"),
    ('[admin]\ntoken = "a b"', "admin.token", "whitespace"),
    ('[upstream]\nbootstrap_servers = ["ok:1", "nohost"]', "upstream.bootstrap_servers[1]", "host:port"),
    ('[upstream]\nbootstrap_servers = ["h:0"]', "upstream.bootstrap_servers[0]", "1..65535"),
    ('[upstream]\nbootstrap_servers = ["::1:9092"]', "upstream.bootstrap_servers[0]", "brackets"),
    ("[upstream]\nbootstrap_servers = []", "upstream.bootstrap_servers", "at least one"),
    ('[upstream]\nbootstrap_servers = "h:1"', "upstream.bootstrap_servers", "expected a list"),
    ("[upstream]\nconnect_timeout_s = 0", "upstream.connect_timeout_s", "greater than 0"),
    ("[limits]\nmax_frame_bytes = 0", "limits.max_frame_bytes", "at least 1"),
    ("[limits]\nmax_frame_bytes = 2147483648", "limits.max_frame_bytes", "2147483647"),
    ("[limits]\nwrite_low_water_bytes = 4194304", "limits.write_low_water_bytes", "below"),
    ("[shutdown]\ndrain_timeout_s = -1.0", "shutdown.drain_timeout_s", "at least 0"),
    ("[shutdown]\ndrain_timeout_s = inf", "shutdown.drain_timeout_s", "finite"),
    ('[logging]\nlevel = "verbose"', "logging.level", "'debug', 'info', 'warning' or 'error'"),
    ('[logging]\nformat = "xml"', "logging.format", "'json' or 'console'"),
    ('[logging]\naccess_log = " "', "logging.access_log", "file path"),
    ("[listen]\nbootstrap_prot = 1", "listen.bootstrap_prot", "did you mean 'bootstrap_port'"),
    ("[lsten]\nbootstrap_port = 1", "lsten", "unknown section (did you mean 'listen'?)"),
    ("[throttles]\nx = 1", "throttles", "unknown section"),
    ('[[throttle.topics]]\ntopic = "orders/eu"', "throttle.topics[0].topic", "cannot occur in a topic name"),
    ('[[throttle.topics]]\ntopic = "orders-[eu"', "throttle.topics[0].topic", "is never closed"),
    ('[[throttle.topics]]\ntopic = "a-*"\n[[throttle.topics]]\ntopic = "a-*"\nreplicas = ""',
     "throttle.topics[1].topic", "is already throttle.topics[0]"),
    ('[admin]\nstate_file = " state.json"', "admin.state_file", "without leading or trailing spaces"),
    ('[admin]\nstate_file = "/var/lib/sluice/"', "admin.state_file", "must name a file, not a directory"),
    ("listen = 5", "listen", "expected a table"),
    ('[logging.access_log_kafka]\ntopic = "logs-*"', "logging.access_log_kafka.topic", "is a glob"),
    ('[logging.access_log_kafka]\ntopic = "a b"', "logging.access_log_kafka.topic", "cannot occur in a topic"),
    ("[logging.access_log_kafka]\nbuffer_events = 0", "logging.access_log_kafka.buffer_events",
     "at least 1"),
    ('[logging.access_log_kafka]\ncompression = "brotli"', "logging.access_log_kafka.compression", "'lz4'"),
    ('[logging.access_log_kafka]\nbootstrap_servers = ["nohost"]', "logging.access_log_kafka.bootstrap_servers[0]",
     "host:port"),
    ('[logging.access_log_kafka]\nproperties = { "queue.buffering.max.messages" = "5" }',
     "logging.access_log_kafka.properties.queue.buffering.max.messages",
     "set by Sluice from logging.access_log_kafka.buffer_events"),
    ("[sharing]\nenabled = true", "sharing.topics", "no topic may be shared"),
    ('[[sharing.topics]]\ntopic = "orders/eu"', "sharing.topics[0].topic", "neither a topic name nor a glob"),
    ('[[sharing.topics]]\ntopic = "o*"\n[[sharing.topics]]\ntopic = "o*"', "sharing.topics[1].topic",
     "already sharing.topics[0]"),
    ('[[sharing.standalone]]\nclient_id = "etl"\ntopic = "orders"\nslice = "2/2"', "sharing.standalone[0].slice",
     "0 <= index < count"),
    ('[[sharing.standalone]]\nclient_id = "etl"\ntopic = "orders-*"\nslice = "0/2"', "sharing.standalone[0].topic",
     "is a glob"),
    ('[[sharing.standalone]]\nclient_id = "a"\ntopic = "t"\nslice = "0/2"\n'
     '[[sharing.standalone]]\nclient_id = "b"\ntopic = "t"\nslice = "1/3"', "sharing.standalone[1].slice",
     "one count per topic"),
    ("[sharing]\nmetadata_max_bytes = 10", "sharing.metadata_max_bytes", "at least 256"),
]


@pytest.mark.parametrize(("text", "key", "reason"), INVALID, ids=[case[1] for case in INVALID])
def test_invalid_value_names_its_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    err = info.value
    assert err.key == key
    assert reason in err.reason
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"{key}: ")
    assert f"(in {path})" in message


# The CLI turns any ConfigError into the same one line (each case's message is checked in-process above); a
# process per case costs ~1.4 s, so it runs for one of each kind: a scalar, a list entry, a cross-field check.
CLI_INVALID = [INVALID[0]] + [case for case in INVALID if case[1] in (
    "sharing.standalone[0].topic", "sharing.standalone[1].slice")]


@pytest.mark.parametrize(("text", "key", "reason"), CLI_INVALID, ids=[case[1] for case in CLI_INVALID])
def test_cli_check_config_exits_2_with_one_line(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = write(tmp_path, text + "\n", name="bad.toml")
    result = sluice("check-config", str(path))
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"config error: {key}: ")
    assert reason in lines[0]


def test_cli_run_with_invalid_config_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, "[listen]\nbootstrap_port = 70000\n", name="bad.toml")
    result = sluice("run", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "config error: listen.bootstrap_port: must be at most 65535, got 70000 "
        f"(in {path})"
    ]


def test_cli_run_reads_env_overrides_and_reports_them(tmp_path: Path) -> None:
    env = {**clean_env(), "SLUICE_LISTEN__BOOTSTRAP_PORT": "many"}
    result = sluice("run", env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "config error: listen.bootstrap_port: expected an integer, got 'many' "
        "(from env SLUICE_LISTEN__BOOTSTRAP_PORT)"
    )


def test_cli_check_config_ok_and_version() -> None:
    result = sluice("check-config", "config/sluice.toml")
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok: config/sluice.toml\n", "")
    result = sluice("version")
    assert result.returncode == 0
    assert result.stdout.startswith("sluice ") and result.stdout.strip() != "sluice"


def test_cli_check_config_no_env_flag(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    env = {**clean_env(), "SLUICE_ADMIN__PORT": "x"}
    assert sluice("check-config", str(path), env=env).returncode == 2
    assert sluice("check-config", "--no-env", str(path), env=env).returncode == 0


def test_cli_usage_error_exits_2() -> None:
    assert sluice().returncode == 2
    assert sluice("no-such-command").returncode == 2


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[listen\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert info.value.key == ""
    assert "not valid TOML" in str(info.value) and "line 1" in str(info.value)
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "missing.toml", env={})
    result = sluice("check-config", str(path))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------------------------- env errors


@pytest.mark.parametrize(
    ("var", "value", "key", "reason"),
    [
        ("SLUICE_LISTEN__BOOTSTRAP_PORT", "x", "listen.bootstrap_port", "expected an integer"),
        ("SLUICE_LISTEN__BOOTSTRAP_PORT", "70000", "listen.bootstrap_port", "at most 65535"),
        ("SLUICE_LISTEN__BOOTSTRAP_PORTT", "1", "listen.bootstrap_portt", "did you mean 'bootstrap_port'"),
        ("SLUICE_LISTN__HOST", "h", "listn", "unknown section"),
        ("SLUICE_LISTEN__HOST__X", "1", "listen.host", "is a key, not a section"),
        ("SLUICE_ADMIN__ENABLED", "maybe", "admin.enabled", "expected true/false"),
        ("SLUICE_UPSTREAM__CONNECT_TIMEOUT_S", "soon", "upstream.connect_timeout_s", "expected a number"),
        ("SLUICE_UPSTREAM__BOOTSTRAP_SERVERS", "a:1,b", "upstream.bootstrap_servers[1]", "host:port"),
        ("SLUICE_UPSTREAM__BOOTSTRAP_SERVERS", "", "upstream.bootstrap_servers", "at least one"),
    ],
)
def test_env_errors_name_key_and_variable(var: str, value: str, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, env={var: value})
    assert info.value.key == key
    assert reason in info.value.reason
    assert str(info.value).endswith(f"(from env {var})")


def test_env_booleans() -> None:
    for text, expected in [("1", True), ("yes", True), ("ON", True), ("0", False), ("False", False)]:
        assert load_settings(None, env={"SLUICE_ADMIN__ENABLED": text}).admin.enabled is expected


def test_access_log_kafka_is_off_by_default_and_set_from_file_and_env(tmp_path: Path) -> None:
    k = load_settings(None, env={}).logging.access_log_kafka
    assert (k.enabled, k.bootstrap_servers, k.topic, k.buffer_events) == (False, [], "sluice-access-log", 100_000)
    path = write(tmp_path, '[logging.access_log_kafka]\nenabled = true\nproperties = { "security.protocol" = "SSL" }\n')
    k = load_settings(path, env={"SLUICE_LOGGING__ACCESS_LOG_KAFKA__BOOTSTRAP_SERVERS": "a:1,b:2",
                                 "SLUICE_LOGGING__ACCESS_LOG_KAFKA__BUFFER_EVENTS": "50"}).logging.access_log_kafka
    assert (k.enabled, k.bootstrap_servers, k.buffer_events) == (True, ["a:1", "b:2"], 50)
    assert k.properties == {"security.protocol": "SSL"}


def test_access_log_kafka_secrets_are_redacted() -> None:
    s = load_settings(None, env={}).with_overrides({"logging.access_log_kafka.properties": {
        "sasl.username": "sluice", "sasl.password": "hunter2", "ssl.key.pem": "-----BEGIN"}})
    shown = s.redacted()["logging"]["access_log_kafka"]["properties"]
    assert shown == {"sasl.username": "sluice", "sasl.password": "***", "ssl.key.pem": "***"}


def test_cli_run_with_a_property_librdkafka_refuses_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, '[admin]\nenabled = false\n[listen]\nbootstrap_port = 0\nbroker_port_base = 0\n'
                           '[logging.access_log_kafka]\nenabled = true\nproperties = { "no.such.property" = "1" }\n',
                 name="bad.toml")
    result = sluice("run", "--config", str(path))
    assert result.returncode == 2, result
    last = result.stderr.splitlines()[-1]
    assert last.startswith("config error: logging.access_log_kafka.properties: librdkafka refused"), last
    assert "no.such.property" in last


def test_secret_value_is_never_echoed(tmp_path: Path) -> None:
    path = write(tmp_path, "[admin]\ntoken = 123456789\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert info.value.key == "admin.token"
    assert "123456789" not in str(info.value)
    settings = load_settings(None, env={"SLUICE_ADMIN__TOKEN": "hunter2"})
    assert "hunter2" not in repr(settings)
    assert settings.redacted()["admin"]["token"] == "***"


def test_several_errors_reported_as_the_first(tmp_path: Path) -> None:
    path = write(tmp_path, "[listen]\nbootstrap_port = 70000\nbroker_port_base = 70001\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert info.value.key == "listen.bootstrap_port"
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------- copies


def test_with_overrides_validates_and_model_copy_does_not() -> None:
    s = load_settings(None, env={})
    t = s.with_overrides({"listen.bootstrap_port": 0, "listen.broker_port_base": 0, "admin.port": 0})
    assert (t.listen.bootstrap_port, t.listen.broker_port_base, t.admin.port) == (0, 0, 0)
    assert s.listen.bootstrap_port == 19092  # the original is untouched
    with pytest.raises(ConfigError) as info:
        s.with_overrides({"limits.write_low_water_bytes": 10**9})
    assert info.value.key == "limits.write_low_water_bytes"
    assert str(info.value).endswith("(from override)")
    with pytest.raises(ConfigError, match="unknown key"):
        s.with_overrides({"listen.nope": 1})
    u = s.model_copy(update={"listen": s.listen.model_copy(update={"bootstrap_port": 0})})
    assert u.listen.bootstrap_port == 0


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.listen.bootstrap_port = 1  # type: ignore[misc]


def test_parse_host_port() -> None:
    assert parse_host_port("kafka:9092") == ("kafka", 9092)
    assert parse_host_port(" 10.0.0.1:1 ") == ("10.0.0.1", 1)
    assert parse_host_port("[fe80::1%eth0]:9092") == ("fe80::1%eth0", 9092)
    for bad in ["kafka", ":9092", "kafka:", "kafka:65536", "kafka:x", "ka fka:1", "[::1]9092", "::1:9092"]:
        with pytest.raises(ValueError):
            parse_host_port(bad)
