"""A new policy is its own package plus one line, nothing else: here the example package tests/support/mark_policy
(one setting, one metric, one access-log field, one request of Sluice's own of an API no built-in policy uses), whose
one line is an entry point (``sluice.policies``, proxy/app.py) or, in-process, one entry more in the registry.

Composed that way it gets its config section (TOML, env overrides, error messages naming its key), its metric on
the proxy's /metrics, its admin endpoint (GET/PUT, the state file), run-time reconfiguration and its access-log
field, from code that names no policy; and a Sluice process with the entry point installed composes it into its real
registry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import proxy
from proxy.app import chain_of, load_settings
from proxy.config import ConfigError, apply_state_file, compose
from proxy.core.broker_calls import Call
from proxy.core.exchange import ConnectionInfo
from proxy.core.registration import Registration
from proxy.reconfigure import reload_file
from proxy.server import Proxy
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from tests.support.admin import admin_over, call
from tests.support.mark_policy import DESCRIBE_CONFIGS, REGISTRATION, Mark, MarkSettings

REPO = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------------ the one line it takes

WITH_MARK = chain_of((REGISTRATION,))
Settings = compose(WITH_MARK)

# ------------------------------------------------------------------------------------------------ the tests


def api_versions_from(proxy: Proxy, client_id: str) -> list[int]:
    """One ApiVersions request of ``client_id`` through the proxy's chain (request side), resumed as the connection
    core does after the calls it waited for; the API keys those calls asked the cluster for. The proxy is not
    started, so the calls are answered here, as the I/O layer would: three configuration entries."""
    header = Message(request_api_key=18, request_api_version=3, correlation_id=1, client_id=client_id)
    info = ConnectionInfo(1, "bootstrap")
    conn = proxy.chain.connect(info)
    ex = proxy.chain.classify(encode_request(header, request_codec(18, 3).default()), 0.0, info)
    proxy.chain.on_request(conn, ex)
    asked: list[int] = []
    while ex.pending is not None:
        for work in proxy.broker_calls.take():
            assert isinstance(work, Call)
            asked.append(work.api_key)
            work.answer = Message(results=[Message(configs=[Message(name=f"c{i}") for i in range(3)])])
            work.settle()
        proxy.chain.on_request(conn, ex)
    if asked:
        assert ex.log == {"mark_config_entries": 3}
    return asked


def test_the_section_is_loaded_from_toml_and_env_with_errors_naming_its_key(tmp_path: Path) -> None:
    toml = tmp_path / "sluice.toml"
    toml.write_text('[mark]\nclient_id = "etl-*"\n')
    assert load_settings(toml, env={}, model=Settings).mark.client_id == "etl-*"
    env = {"SLUICE_MARK__CLIENT_ID": "batch-*"}
    assert load_settings(toml, env=env, model=Settings).mark.client_id == "batch-*"
    with pytest.raises(ConfigError) as e:
        load_settings(toml, env={"SLUICE_MARK__CLIENT_IDS": "x"}, model=Settings)
    assert str(e.value).startswith("mark.client_ids: unknown key (did you mean 'client_id'?)")
    toml.write_text("[mark]\nclient_id = 3\n")
    with pytest.raises(ConfigError) as e:
        load_settings(toml, env={}, model=Settings)
    assert str(e.value) == f"mark.client_id: expected a string, got 3 (in {toml})"
    # the registered policies' model is untouched: without the line, no section
    with pytest.raises(ConfigError, match=r"^mark: unknown section"):
        load_settings(None, env={"SLUICE_MARK__CLIENT_ID": "x"})
    assert Settings.dynamic_sections == (*load_settings(None, env={}).dynamic_sections, "mark")


async def test_metric_admin_endpoint_state_file_reconfiguration_and_its_own_requests(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    settings = load_settings(None, env={}, model=Settings).with_overrides(
        {"mark.client_id": "etl-*", "admin.state_file": str(state_file)})
    async with admin_over(settings) as (proxy, url):
        assert isinstance(proxy.policy("mark"), Mark)
        assert [p.name for p in proxy.chain.policies][-2:] == ["mark", "terminate"]  # before the broker side
        assert api_versions_from(proxy, "etl-1") == [DESCRIBE_CONFIGS]
        assert api_versions_from(proxy, "web-1") == []
        assert "sluice_mark_requests_total 1.0" in (await call("GET", f"{url}/metrics")).text.splitlines()

        shown = (await call("GET", f"{url}/mark")).json()
        assert shown == {"client_id": "etl-*", "revision": 0, "store": "this instance"}
        r = await call("PUT", f"{url}/mark", {"client_id": "web-*"})
        assert r.status == 200 and r.json() == {"client_id": "web-*", "revision": 1, "store": "this instance"}
        assert api_versions_from(proxy, "etl-1") == []
        assert api_versions_from(proxy, "web-1") == [DESCRIBE_CONFIGS]
        assert api_versions_from(proxy, "web-2") == [DESCRIBE_CONFIGS]
        assert proxy.metrics.total("sluice_mark_requests_total") == 3
        r = await call("PUT", f"{url}/mark", {"client_id": 7})
        assert r.status == 400 and r.json()["key"] == "mark.client_id"
        assert proxy.settings.mark.client_id == "web-*"

    assert json.loads(state_file.read_text())["mark"] == {"client_id": "web-*"}
    # a restart (or SIGHUP) brings the admin change back over the configuration
    assert apply_state_file(settings).mark.client_id == "web-*"


def test_sighup_reload_applies_the_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.upper().startswith("SLUICE_") and "__" in v]:
        monkeypatch.delenv(var)  # the reload reads the process environment, as a SIGHUP does
    toml = tmp_path / "sluice.toml"
    toml.write_text('[mark]\nclient_id = "etl-*"\n')
    proxy = Proxy(load_settings(toml, env={}, model=Settings))
    toml.write_text('[mark]\nclient_id = "web-*"\n')
    assert reload_file(proxy, str(toml))
    assert proxy.settings.mark.client_id == "web-*"
    assert api_versions_from(proxy, "etl-1") == []
    assert api_versions_from(proxy, "web-1") == [DESCRIBE_CONFIGS]
    assert proxy.metrics.total("sluice_mark_requests_total") == 1


def test_a_section_is_registered_once() -> None:
    with pytest.raises(ValueError, match=r"^sections registered twice: mark$"):
        compose((*WITH_MARK, REGISTRATION))
    with pytest.raises(ValueError, match=r"^sections registered twice: listen$"):
        compose((*WITH_MARK, Registration(Mark, "listen", MarkSettings)))


def test_nothing_of_sluice_names_the_example_policy() -> None:
    """The package and the line are all it took: no module of Sluice's names anything of it."""
    names = ("mark", "Mark", "mark_config_entries", "sluice_mark_requests_total")
    found = [f"{path.relative_to(REPO)}: {name}" for path in Path(proxy.__file__).parent.rglob("*.py")
             for name in names if f'"{name}"' in path.read_text() or f"import {name}" in path.read_text()]
    assert found == []


def installed(tmp_path: Path, entry: str) -> dict[str, str]:
    """An environment in which a package with the ``sluice.policies`` entry point ``entry`` is installed (its
    dist-info on the path, as pip writes it), for a Sluice process of its own."""
    dist = tmp_path / "site" / "sluice_example-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sluice-example\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[sluice.policies]\n{entry}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(REPO)])
    return env


def test_an_installed_entry_point_is_composed_into_the_real_registry(tmp_path: Path) -> None:
    env = installed(tmp_path, "mark = tests.support.mark_policy:REGISTRATION")
    probe = textwrap.dedent("""
        import json
        from proxy.app import REGISTRY, Settings, load_settings
        from proxy.server import Proxy
        proxy = Proxy(load_settings(None, env={"SLUICE_MARK__CLIENT_ID": "etl-*"}))
        print(json.dumps({"sections": [r.section for r in REGISTRY], "dynamic": list(Settings.dynamic_sections),
                          "chain": [p.name for p in proxy.chain.policies], "client_id": proxy.settings.mark.client_id,
                          "metric": any(m.name == "sluice_mark_requests" for m in proxy.metrics.registry.collect())}))
    """)
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["sections"][-2:] == ["mark", "sessions"] and out["chain"][-2:] == ["mark", "terminate"]
    assert out["dynamic"][-1] == "mark" and out["client_id"] == "etl-*" and out["metric"] is True
    toml = tmp_path / "sluice.toml"
    toml.write_text("[mark]\nclient_id = 3\n")
    check = subprocess.run([sys.executable, "-m", "proxy", "check-config", "--no-env", str(toml)], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (check.returncode, check.stdout) == (2, "")
    assert check.stderr.strip().endswith(f"mark.client_id: expected a string, got 3 (in {toml})")


def test_an_entry_point_that_does_not_load_is_one_configuration_error(tmp_path: Path) -> None:
    env = installed(tmp_path, "broken = no_such_package.policy:REGISTRATION")
    (tmp_path / "sluice.toml").write_text("")
    check = subprocess.run([sys.executable, "-m", "proxy", "check-config", "--no-env", "sluice.toml"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (check.returncode, check.stdout) == (2, "")
    assert check.stderr == ("config error: sluice.policies.broken: no_such_package.policy:REGISTRATION does not "
                            "load: ModuleNotFoundError: No module named 'no_such_package'\n")
