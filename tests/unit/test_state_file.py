"""admin.state_file: admin API changes to [throttle] and [size_limit] are saved atomically and applied over the
config file at start-up and on every SIGHUP (proxy/config/state.py, proxy/reconfigure.py); a corrupt state file is one
error naming the key, exit code 2."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy import reconfigure
from proxy.app import DYNAMIC_SECTIONS, load_settings
from proxy.config import ConfigError, apply_state_file, read_state, save_state_section, write_state
from proxy.policies.throttle import Throttle
from proxy.policies.throttle.policy import CONSUMER
from tests.support.admin import admin_over, call
from tests.unit.test_config import clean_env, sluice

THROTTLE = {"leader_rate_bytes": 1, "follower_rate_bytes": 0, "window_s": 1.0, "samples": 11,
            "topics": [{"topic": "orders-*", "replicas": "*"}, {"topic": "orders-audit", "replicas": ""}],
            "consumers": [{"client_id": "backfill-*", "principal": None, "client_address": None}]}
SIZE_LIMIT = {"budgets": [{"client_id": "*", "principal": None, "client_address": None,
                          "replicas": False, "fetch_max_bytes": 1000, "partition_max_bytes": 0}],
              "fairness": "off", "global_max_bytes": 0}


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGHUP reloads read os.environ: keep the runner's SLUICE_* overrides out of these tests."""
    for var in list(os.environ):
        if var.upper().startswith("SLUICE_"):
            monkeypatch.delenv(var)


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """The operational log events of the test (asserted on, not printed)."""
    with capture_logs() as events:
        yield events


def config_file(tmp_path: Path, state: Path, leader_rate: int = 7) -> Path:
    path = tmp_path / "sluice.toml"
    path.write_text(f'[admin]\nport = 0\nstate_file = "{state}"\n'
                    f'[throttle]\nleader_rate_bytes = {leader_rate}\nfollower_rate_bytes = 3\n'
                    '[[throttle.topics]]\ntopic = "from-file"\n'
                    '[[size_limit.budgets]]\nclient_id = "file-*"\nfetch_max_bytes = 5000\n')
    return path


# ------------------------------------------------------------------------------------ write and read


def test_write_then_read_back(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert read_state(str(path), DYNAMIC_SECTIONS) == {}  # no file yet: nothing was changed through the admin API
    write_state(str(path), {"throttle": THROTTLE})
    assert read_state(str(path), DYNAMIC_SECTIONS) == {"throttle": THROTTLE}
    assert json.loads(path.read_text()) == {"version": 1, "throttle": THROTTLE}
    assert os.listdir(tmp_path) == ["state.json"]  # no temporary file left behind


def test_write_is_temp_file_fsync_rename_in_the_same_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    write_state(str(path), {"throttle": THROTTLE})
    events: list[Any] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        # At the moment of the rename, the new content is complete in a file next to the old one, and the old
        # file is still whole: a reader sees one or the other.
        events.append(("replace", Path(src).parent == Path(dst).parent, json.loads(Path(src).read_text()),
                       json.loads(Path(dst).read_text())))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_state(str(path), {"throttle": THROTTLE, "size_limit": SIZE_LIMIT})
    assert events == [
        ("fsync", "file"),
        ("replace", True, {"version": 1, "throttle": THROTTLE, "size_limit": SIZE_LIMIT},
         {"version": 1, "throttle": THROTTLE}),
        ("fsync", "directory"),  # the rename itself is durable
    ]
    assert read_state(str(path), DYNAMIC_SECTIONS) == {"throttle": THROTTLE, "size_limit": SIZE_LIMIT}


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    write_state(str(path), {"throttle": THROTTLE})
    before = path.read_bytes()

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        write_state(str(path), {"size_limit": SIZE_LIMIT})
    with pytest.raises(ConfigError) as e:
        save_state_section(str(path), "size_limit", SIZE_LIMIT, DYNAMIC_SECTIONS)
    assert e.value.key == "admin.state_file" and os.strerror(errno.ENOSPC) in e.value.reason
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["state.json"]


def test_saving_a_section_keeps_the_other(tmp_path: Path) -> None:
    path = str(tmp_path / "state.json")
    save_state_section(path, "throttle", THROTTLE, DYNAMIC_SECTIONS)
    save_state_section(path, "size_limit", SIZE_LIMIT, DYNAMIC_SECTIONS)
    save_state_section(path, "throttle", {**THROTTLE, "leader_rate_bytes": 2}, DYNAMIC_SECTIONS)
    assert read_state(path, DYNAMIC_SECTIONS) == {"throttle": {**THROTTLE, "leader_rate_bytes": 2},
                                                  "size_limit": SIZE_LIMIT}


CORRUPT = [
    (b"", "is not valid JSON"),
    (b'{"version": 1, "throttle": {', "is not valid JSON"),
    (b"\xff\xfe\x00", "is not valid JSON"),
    (b"[]", "is not a Sluice state file"),
    (b'{"throttle": {}}', "is not a Sluice state file"),
    (b'{"version": 2, "throttle": {}}', "is not a Sluice state file"),
    (b'{"version": 1, "sessions": {}}', "unknown section 'sessions'"),
    (b'{"version": 1, "throttle": []}', "'throttle' is not a JSON object"),
    (b'{"version": 1, "throttle": {"topics": [{"topic": "a/b"}]}}', "throttle.topics[0].topic: 'a/b' is neither"),
    (b'{"version": 1, "throttle": {"leader_rate_bytes": "fast"}}', "throttle.leader_rate_bytes: expected an integer"),
]


@pytest.mark.parametrize(("content", "reason"), CORRUPT, ids=[r for _, r in CORRUPT])
def test_corrupt_state_file_is_one_error_naming_the_key(tmp_path: Path, content: bytes, reason: str) -> None:
    state = tmp_path / "state.json"
    state.write_bytes(content)
    settings = load_settings(config_file(tmp_path, state), env={})
    with pytest.raises(ConfigError) as e:
        apply_state_file(settings)
    assert e.value.key == "admin.state_file"
    assert reason in e.value.reason and str(state) in e.value.reason
    assert "\n" not in str(e.value)


def test_unreadable_state_file_or_missing_directory(tmp_path: Path) -> None:
    (tmp_path / "dir.json").mkdir()
    for state, reason in ((tmp_path / "dir.json", "cannot read"), (tmp_path / "nope" / "s.json", "does not exist")):
        settings = load_settings(config_file(tmp_path, state), env={})
        with pytest.raises(ConfigError) as e:
            apply_state_file(settings)
        assert e.value.key == "admin.state_file" and reason in e.value.reason


# ------------------------------------------------------------------------------------------ precedence


def test_state_file_wins_over_environment_file_and_defaults(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    config = config_file(tmp_path, state)
    from_file = load_settings(config, env={"SLUICE_THROTTLE__SAMPLES": "5"})
    assert apply_state_file(from_file) == from_file  # no state file yet: the file (+ env) as is
    assert apply_state_file(from_file, "") == from_file  # no state file configured
    save_state_section(str(state), "throttle", THROTTLE, DYNAMIC_SECTIONS)
    applied = apply_state_file(from_file)
    # The saved section replaces the whole section (follower_rate_bytes and the env's samples included) ...
    assert applied.throttle.model_dump() == THROTTLE
    # ... and only that section: [size_limit] was never changed through the admin API.
    assert applied.size_limit == from_file.size_limit and applied.admin == from_file.admin


def test_cli_run_with_corrupt_state_file_exits_2_naming_the_key(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{not json")
    config = tmp_path / "sluice.toml"
    config.write_text(f'[admin]\nstate_file = "{state}"\n')
    result = sluice("run", "--config", str(config))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"config error: admin.state_file: {state} is not valid JSON")
    # check-config validates the config file only (the state file is run-time state, read by `run`).
    assert sluice("check-config", str(config)).returncode == 0
    env = {**clean_env(), "SLUICE_ADMIN__STATE_FILE": str(tmp_path / "missing" / "state.json")}
    result = sluice("run", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("config error: admin.state_file: directory ")


# ---------------------------------------------------------------------------- admin API and SIGHUP


async def json_call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    answer = await call(method, url, body)
    return answer.status, answer.json()


async def test_admin_changes_are_saved_and_survive_restart_and_sighup(tmp_path: Path,
                                                                      logs: list[dict[str, Any]]) -> None:
    state = tmp_path / "state.json"
    config = config_file(tmp_path, state)
    async with admin_over(apply_state_file(load_settings(config, env={}))) as (proxy, url):
        assert not state.exists()  # nothing changed through the admin API yet
        status, applied = await json_call("PUT", f"{url}/throttles", THROTTLE)
        assert status == 200 and applied == {**THROTTLE, "revision": 1, "store": "this instance"}
        assert read_state(str(state), DYNAMIC_SECTIONS) == {"throttle": THROTTLE}
        # GET shows the entries as configured: globs as written, in order.
        status, shown = await json_call("GET", f"{url}/throttles")
        assert status == 200 and shown["topics"] == THROTTLE["topics"]
        policy = proxy.policy("throttle")
        assert isinstance(policy, Throttle)
        throttles = policy.throttles
        assert throttles.throttled("orders-eu", 0, CONSUMER) and not throttles.throttled("orders-audit", 0, CONSUMER)
        assert (await json_call("PUT", f"{url}/size-limits", SIZE_LIMIT)) == (
            200, {**SIZE_LIMIT, "revision": 1, "store": "this instance"})
        assert read_state(str(state), DYNAMIC_SECTIONS) == {"throttle": THROTTLE, "size_limit": SIZE_LIMIT}
        # A refused change is not saved.
        bad = await json_call("PUT", f"{url}/throttles", {"topics": [{"topic": "x"}, {"topic": "x"}]})
        assert bad[0] == 400 and bad[1]["key"] == "throttle.topics[1].topic"
        assert read_state(str(state), DYNAMIC_SECTIONS)["throttle"] == THROTTLE

        # A restart reads the config file and then the state file: the admin changes are back.
        restarted = apply_state_file(load_settings(config, env={}))
        assert restarted.throttle == proxy.settings.throttle and restarted.size_limit == proxy.settings.size_limit

        # SIGHUP re-reads the config file and then re-applies the state file: the admin changes still win ...
        config_file(tmp_path, state, leader_rate=9)
        assert reconfigure.reload_file(proxy, str(config))
        assert proxy.settings.throttle.model_dump() == THROTTLE
        assert proxy.settings.size_limit.model_dump() == SIZE_LIMIT
        # ... until the state file is deleted: the next SIGHUP hands both sections back to the config file.
        state.unlink()
        assert reconfigure.reload_file(proxy, str(config))
        assert proxy.settings.throttle.leader_rate_bytes == 9
        assert [t.topic for t in proxy.settings.throttle.topics] == ["from-file"]
        assert proxy.settings.size_limit == load_settings(config, env={}).size_limit
        assert (await json_call("GET", f"{url}/throttles"))[1]["leader_rate_bytes"] == 9
    assert [e["event"] for e in logs] == ["reconfigured", "admin_changed"] * 2 + ["reconfigured"] * 2  # two PUTs,
    # two reloads; the refused PUT is not


async def test_change_that_cannot_be_saved_is_refused_and_not_applied(tmp_path: Path,
                                                                      logs: list[dict[str, Any]]) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state = state_dir / "state.json"
    config = config_file(tmp_path, state)
    async with admin_over(apply_state_file(load_settings(config, env={}))) as (proxy, url):
        before = proxy.settings
        # A corrupt state file is not overwritten (it may hold the other section): the change is refused.
        state.write_text("{oops")
        status, err = await json_call("PUT", f"{url}/throttles", THROTTLE)
        assert status == 500 and err["key"] == "admin.state_file" and "is not valid JSON" in err["error"]
        assert state.read_text() == "{oops"
        # So is a SIGHUP reload: the running configuration stays.
        assert not reconfigure.reload_file(proxy, str(config))
        # The directory is gone: nothing can be saved, so nothing is applied (a restart would not bring it back).
        shutil.rmtree(state_dir)
        status, err = await json_call("PUT", f"{url}/size-limits", SIZE_LIMIT)
        assert status == 500 and err["key"] == "admin.state_file" and str(state) in err["error"]
        assert proxy.settings == before
        assert (await json_call("GET", f"{url}/throttles"))[1]["leader_rate_bytes"] == 7
        policy = proxy.policy("throttle")
        assert isinstance(policy, Throttle) and not policy.throttles.throttled("orders-eu", 0, CONSUMER)
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("state_file_not_saved", "error"), ("reload_refused", "error"), ("state_file_not_saved", "error")]

