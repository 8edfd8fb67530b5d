"""Settings come from the environment in one place: every ``CRIOGENAI_<FIELD>`` is a field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from criogenai import ConfigurationError, Settings
from criogenai._config import WORKER_OPTIONS, WorkerSettings, env_name, option_flag
from tests.conftest import PYTHONPATH, ROOT

SAMPLES = {
    "broker_url": "redis://h:1/0", "result_backend": "redis://h:1/1", "redis_url": "redis://h:1/2",
    "key_prefix": "x", "lease_secs": "7", "retention_secs": "120", "visibility_timeout_secs": "99",
    "heartbeat_ttl_secs": "4", "loop_stall_secs": "9", "celery_result_records": "1",
    "signing_secret": "s" * 16, "mcp_token": "t" * 16,
}


def test_every_setting_is_read_from_its_variable() -> None:
    assert set(SAMPLES) == set(Settings.model_fields)
    s = Settings.from_env({env_name(k): v for k, v in SAMPLES.items()})
    for field, raw in SAMPLES.items():
        value = getattr(s, field)
        assert str(int(value) if isinstance(value, bool) else value).removesuffix(".0") == raw, field


def test_an_empty_variable_is_the_default_and_a_bad_one_is_refused_without_its_value() -> None:
    assert Settings.from_env({"CRIOGENAI_KEY_PREFIX": "", "CRIOGENAI_BROKER_URL": ""}) == Settings()
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"CRIOGENAI_SIGNING_SECRET": "hunter2-hunter"})
    assert "hunter2" not in str(caught.value)


def test_worker_settings_read_names_flags_and_ports_as_the_variables_hold_them() -> None:
    w = WorkerSettings.from_env({
        "CRIOGENAI_TOOLS": "a.tools, b.tools,", "CRIOGENAI_QUEUES": "gpu", "CRIOGENAI_OTEL": "yes please",
        "CRIOGENAI_METRICS_PORT": "9100", "CRIOGENAI_LOG_FORMAT": "json",
    })
    assert (w.tools, w.queues, w.otel, w.metrics_port, w.log_format) == (
        ("a.tools", "b.tools"), ("gpu",), True, 9100, "json"
    )
    assert WorkerSettings.from_env({"CRIOGENAI_OTEL": "0"}).otel is False
    assert WorkerSettings.from_env({}, tools=["a,b", "c"]).tools == ("a", "b", "c")
    with pytest.raises(ConfigurationError, match="TCP port"):
        WorkerSettings.from_env({"CRIOGENAI_HEALTH_PORT": "http"})


def test_the_process_settings_are_shared_until_the_environment_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRIOGENAI_KEY_PREFIX", "one")
    first = Settings.from_env()
    assert Settings.from_env() is first and first.key_prefix == "one"
    monkeypatch.setenv("CRIOGENAI_KEY_PREFIX", "two")
    assert Settings.from_env().key_prefix == "two"
    assert Settings.from_env(key_prefix="three").key_prefix == "three"


def test_both_worker_commands_offer_every_worker_option_with_its_variable() -> None:
    from criogenai.worker._options import worker_options

    celerys = {o.opts[0] for o in worker_options()}
    assert celerys == {option_flag(n) for n in WORKER_OPTIONS}
    helped = subprocess.run([sys.executable, "-m", "criogenai", "worker", "--help"], cwd=ROOT,
                            env={"PYTHONPATH": PYTHONPATH, "COLUMNS": "200"}, capture_output=True, text=True)
    assert helped.returncode == 0, helped.stderr
    for name in WORKER_OPTIONS:
        assert option_flag(name) in helped.stdout and f"${env_name(name)}" in helped.stdout, name


def test_the_readme_lists_every_variable() -> None:
    readme = (ROOT / "README.md").read_text()
    fields = [*Settings.model_fields, *WorkerSettings.model_fields]
    missing = [env_name(f) for f in fields if env_name(f) not in readme]
    assert not missing, missing
