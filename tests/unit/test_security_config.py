"""The security settings: each invalid one is one ConfigError naming its key (exit code 2 from `sluice
check-config`), including certificates that cannot be used together; secrets never in the message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.app import load_settings
from proxy.config import ConfigError
from proxy.tls import TlsContexts
from rig.pki import CA

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("pem")
    ca = CA(d, "cfg")
    a, b = ca.issue("a"), ca.issue("b")
    return {"ca": str(ca.cert), "cert": str(a.cert), "key": str(a.key), "other_key": str(b.key)}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sluice.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "key", "reason"), [
    ("[listen.tls]\nenabled = true", "listen.tls.cert_file", "needed when TLS is enabled"),
    ('[listen.tls]\nenabled = true\ncert_file = "{cert}"', "listen.tls.key_file", "needed"),
    ('[listen.tls]\nclient_auth = "required"', "listen.tls.ca_file", "client_auth = 'required'"),
    ('[listen.tls]\nmin_version = "TLSv1.3"\nmax_version = "TLSv1.2"', "listen.tls.max_version", "below"),
    ('[listen.tls]\nmin_version = "TLSv1.1"', "listen.tls.min_version", "'TLSv1.2' or 'TLSv1.3'"),
    ('[listen.tls]\ncert_file = "/no/such.pem"', "listen.tls.cert_file", "no such file"),
    ('[upstream.tls]\ncert_file = "{cert}"', "upstream.tls.key_file", "go together"),
    ('[listen]\nproxy_protocol = "v3"', "listen.proxy_protocol", "'off', 'v1', 'v2' or 'any'"),
    ('[[listen.listeners]]\nlistener = "broker 1"', "listen.listeners[0].listener", "broker-N"),
    ("[limits]\nmax_connections = -1", "limits.max_connections", "at least 0"),
    ("[limits]\nidle_timeout_s = -1.0", "limits.idle_timeout_s", "at least 0"),
    ('[upstream.sasl]\nmechanism = "PLAIN"', "upstream.sasl.username", "needed"),
    ('[upstream.sasl]\nmechanism = "PLAIN"\nusername = "s"', "upstream.sasl.password", "needed"),
    ('[upstream.sasl]\nmechanism = "GSSAPI"', "upstream.sasl.mechanism", "'SCRAM-SHA-512'"),
    ('[[size_limit.budgets]]\nclient_address = "10.0.0.0/33"', "size_limit.budgets[0].client_address", "CIDR"),
    ('[[size_limit.budgets]]\nprincipal = "a"\nreplicas = true', "size_limit.budgets[0].client_id", "exactly one"),
    ("[[throttle.consumers]]", "throttle.consumers[0].client_id", "at least one"),
    ('[admin]\ntls_cert_file = "{cert}"', "admin.tls_key_file", "go together"),
])
def test_invalid_security_settings_name_their_key(tmp_path: Path, pem: dict[str, str], text: str, key: str,
                                                  reason: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(write(tmp_path, text.format(**pem)), env={})
    assert e.value.key == key and reason in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_secrets_stay_out_of_messages(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(write(tmp_path, '[upstream.sasl]\nmechanism = "PLAIN"\nusername = "s"\npassword = 5'), env={})
    assert e.value.key == "upstream.sasl.password"
    settings = load_settings(None, env={"SLUICE_UPSTREAM__SASL__PASSWORD": "hunter2-pw",
                                        "SLUICE_UPSTREAM__SASL__MECHANISM": "PLAIN",
                                        "SLUICE_UPSTREAM__SASL__USERNAME": "svc", "SLUICE_ADMIN__TOKEN": "tok3n"})
    shown = repr(settings) + str(settings.redacted())
    assert "hunter2-pw" not in shown and "tok3n" not in shown


def test_a_key_that_does_not_match_its_certificate_is_a_config_error(tmp_path: Path, pem: dict[str, str]) -> None:
    text = f'[listen.tls]\nenabled = true\ncert_file = "{pem["cert"]}"\nkey_file = "{pem["other_key"]}"\n'
    settings = load_settings(write(tmp_path, text), env={})
    with pytest.raises(ConfigError) as e:
        TlsContexts(settings)
    assert e.value.key == "listen.tls.cert_file" and "KEY_VALUES_MISMATCH" in str(e.value)
    done = subprocess.run([sys.executable, "-m", "proxy", "check-config", "--no-env", str(tmp_path / "sluice.toml")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "listen.tls.cert_file" in done.stderr


def test_tls_contexts_follow_the_listener_entries(tmp_path: Path, pem: dict[str, str]) -> None:
    text = (f'[listen]\nproxy_protocol = "v1"\n[listen.tls]\nenabled = true\ncert_file = "{pem["cert"]}"\n'
            f'key_file = "{pem["key"]}"\n[[listen.listeners]]\nlistener = "broker-*"\nproxy_protocol = "off"\n')
    contexts = TlsContexts(load_settings(write(tmp_path, text), env={}))
    assert contexts.listener("bootstrap").proxy_protocol == "v1"
    assert contexts.listener("broker-3").proxy_protocol == "off"
    assert contexts.listener("broker-3").ssl is contexts.listener("bootstrap").ssl is not None
    assert not contexts.check()  # nothing changed
    Path(pem["cert"]).touch()
    assert contexts.check()  # a file changed: rebuilt
