"""One range per number: the config file and `settings set` (CLI and dashboard) refuse the same values."""

from __future__ import annotations

import pytest

from vastctl import config as config_module
from vastctl.errors import BadInput
from vastctl.state import settings

# (setting, value as typed, the same value as YAML would give it)
BAD_SETTINGS = [
    ("max_instances", "1e41", 10**41),
    ("max_instances", "10001", 10001),
    ("max_instances", "2.5", 2.5),
    ("max_instances", "-1", -1),
    ("max_dph", "0", 0),
    ("max_dph", "5000", 5000.0),
    ("max_hourly_spend", "0", 0.0),
    ("max_hourly_spend", "1e300", 1e300),
    ("target_proofs_per_hour", "-5", -5),
    ("target_proofs_per_hour", "9" * 400, int("9" * 400)),
    ("min_bench_rate", "inf", float("inf")),
]
GOOD_SETTINGS = [("max_instances", "0", 0), ("max_instances", "10000", 10000), ("max_dph", "0.35", 0.35),
                 ("max_hourly_spend", "1000", 1000), ("target_proofs_per_hour", "0", 0)]


def from_yaml_value(section_key: str, value):
    section, key = section_key.split(".")
    return config_module.from_mapping({section: {key: value}})


@pytest.mark.parametrize("key, text, value", BAD_SETTINGS)
def test_a_value_settings_refuses_the_config_refuses_too(key, text, value):
    with pytest.raises(BadInput) as by_settings:
        settings.parse_value(key, text)
    with pytest.raises(BadInput) as by_config:
        from_yaml_value(f"fleet.{key}", value)
    allowed = config_module.range_of(f"fleet.{key}", "int" if key == "max_instances" else "float")
    wanted = allowed.describe("int" if key == "max_instances" else "float")
    assert str(by_settings.value).startswith(f"{key} must be {wanted}, got")
    assert str(by_config.value).startswith(f"config key 'fleet.{key}' must be {wanted}, got")


@pytest.mark.parametrize("key, text, value", GOOD_SETTINGS)
def test_a_value_one_accepts_the_other_accepts(key, text, value):
    assert settings.parse_value(key, text) == value
    assert getattr(from_yaml_value(f"fleet.{key}", value).fleet, key) == value


def test_a_zero_price_limit_says_why_in_both():
    for message in (_refusal(lambda: settings.parse_value("max_dph", "0")),
                    _refusal(lambda: from_yaml_value("fleet.max_dph", 0))):
        assert "0 would refuse every launch (to pause launches, set max_instances 0)" in message


@pytest.mark.parametrize("key, value, says", [
    ("reconcile.deadline", 0, "a duration above 0s and at most 1h"),
    ("reconcile.deadline", "2h", "a duration above 0s and at most 1h"),
    ("agent.deadline", "0s", "a duration above 0s and at most 1h"),
    ("timeouts.heartbeat", 0, "a duration above 0s and at most 365d"),
    ("agent.interval", "400d", "a duration above 0s and at most 365d"),
    ("vast.blocklist_ttl", 1e300, "a duration from 0s to 365d"),
    ("agent.max_rounds", 0, "a whole number from 1 to 100"),
    ("reconcile.disappear_confirmations", 0, "a whole number from 1 to 100"),
    ("agent.max_context_tokens", 10, "a whole number from 1000 to 1000000"),
    ("reconcile.max_vanish_fraction", 1.5, "a number from 0 to 1"),
    ("launch.disk_gb", 0, "a number above 0 and at most 100000"),
    ("sim.seed", 2**64, "a whole number from 0 to 9223372036854775807"),
])
def test_config_only_numbers_have_ranges_too(key, value, says):
    assert f"config key {key!r} must be {says}, got {value!r}" in _refusal(lambda: from_yaml_value(key, value))


def test_the_cli_and_the_dashboard_refuse_what_the_config_refuses(tmp_path, cli):
    config = tmp_path / "config.yaml"
    config.write_text("fleet:\n  max_instances: 100000000000000000000000000000000000000000\n")
    result = cli("--config", str(config), "settings", "list")
    assert result.code == 2 and result.err.count("\n") == 1
    assert result.err.startswith(f"error: config file {config}: config key 'fleet.max_instances' must be a whole"
                                 " number from 0 to 10000")
    config.write_text("reconcile:\n  deadline: 0\n")
    result = cli("--config", str(config), "settings", "list")
    assert result.code == 2 and "config key 'reconcile.deadline' must be a duration above 0s" in result.err
    assert "0 would stop every pass" in result.err


def test_a_number_of_thousands_of_digits_in_the_config_is_one_error_line(tmp_path, cli):
    config = tmp_path / "config.yaml"
    config.write_text(f"fleet:\n  max_instances: {'9' * 5000}\n")
    result = cli("--config", str(config), "settings", "list")
    assert result.code == 2 and result.err.count("\n") == 1
    assert result.err.startswith(f"error: config file {config} holds a value no setting can take")


def test_settings_set_refuses_1e41_and_changes_nothing(tmp_path, cli):
    assert cli("init").code == 0
    result = cli("settings", "set", "max_instances", "1e41")
    assert result.code == 2 and result.err == (
        "error: max_instances must be a whole number from 0 to 10000, got '1e41'\n")
    assert cli("settings", "get", "max_instances").out == "10\n"
    assert cli("events", "--json").out.strip() == "[]"


def _refusal(call) -> str:
    with pytest.raises(BadInput) as refused:
        call()
    return str(refused.value)
