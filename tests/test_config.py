"""config: precedence flag > environment > file > default, durations, and errors that name the key."""

from __future__ import annotations

import pytest

from vastctl import config as config_module
from vastctl.config import parse_duration
from vastctl.errors import BadInput


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), (45, 45),
                                          ("1.5h", 5400), ("600", 600), (" 5m ", 300)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 minutes", "-1", "h", "", True, "1w", "nan"])
def test_bad_durations(text):
    with pytest.raises(BadInput, match="timeouts.launching"):
        parse_duration(text, "timeouts.launching")


def test_defaults_without_any_file(monkeypatch, tmp_path):
    monkeypatch.delenv("VASTCTL_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = config_module.load()
    assert config.fleet.min_bench_rate == 40
    assert config.timeouts.params_done == 90 * 60
    assert config.vast.label_prefix == "vastctl-"
    assert config.launch.disk_gb == 150
    assert config.db == str(tmp_path / "data" / "vastctl" / "vastctl.db")
    assert config.source == ""


def test_file_beats_default_and_env_beats_file(tmp_path, monkeypatch):
    path = write(tmp_path, "db: /from/file.db\nfleet:\n  min_bench_rate: 55\ntimeouts:\n  heartbeat: 2m\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(path))
    monkeypatch.setenv("VASTCTL_DB", "/from/env.db")
    config = config_module.load()
    assert config.fleet.min_bench_rate == 55.0
    assert config.timeouts.heartbeat == 120
    assert config.db == "/from/env.db"
    monkeypatch.delenv("VASTCTL_DB")
    assert config_module.load().db == "/from/file.db"


def test_the_admin_token_comes_from_the_environment_else_the_file_else_beside_the_state_file(tmp_path, monkeypatch):
    """VASTCTL_ADMIN_TOKEN as the environment file's other secrets; FILE.admin-token as `demo --keep` leaves it."""
    path = write(tmp_path, 'server:\n  admin_token: "from-the-config-file-0123456789"\n')
    monkeypatch.setenv("VASTCTL_CONFIG", str(path))
    monkeypatch.setenv("VASTCTL_ADMIN_TOKEN", " from-the-environment-0123456789\n")
    assert config_module.load().server.admin_token == "from-the-environment-0123456789"
    monkeypatch.setenv("VASTCTL_ADMIN_TOKEN", "")
    assert config_module.load().server.admin_token == "from-the-config-file-0123456789"
    beside = config_module.admin_token_file(tmp_path / "vastctl.db")  # VASTCTL_DB of the test
    beside.write_text("kept-beside-the-state-file-0123456789\n")
    config = config_module.load()
    config_module.admin_token_beside(config)
    assert config.server.admin_token == "from-the-config-file-0123456789"  # a token set anywhere wins
    path.write_text("")
    config = config_module.load()
    config_module.admin_token_beside(config)
    assert config.server.admin_token == "kept-beside-the-state-file-0123456789"


def test_explicit_path_beats_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VASTCTL_CONFIG", str(write(tmp_path, "fleet: {max_instances: 3}", "a.yaml")))
    explicit = write(tmp_path, "fleet: {max_instances: 7}", "b.yaml")
    assert config_module.load(str(explicit)).fleet.max_instances == 7


def test_the_default_file_is_read_when_it_exists(tmp_path):
    home_config = tmp_path / "home" / ".config" / "vastctl"
    home_config.mkdir(parents=True)
    (home_config / "config.yaml").write_text("agent:\n  interval: 10m\n")
    config = config_module.load()
    assert config.agent.interval == 600
    assert config.source.endswith("config.yaml")


def test_cli_flag_beats_env_for_the_db(tmp_path, monkeypatch, cli):
    flag_db = tmp_path / "flag.db"
    assert cli("--db", str(flag_db), "init").code == 0
    assert flag_db.exists()
    assert not (tmp_path / "vastctl.db").exists()  # what VASTCTL_DB names


def test_example_config_is_valid_and_documents_every_key():
    from pathlib import Path

    import yaml

    example = Path(__file__).resolve().parents[1] / "config.example.yaml"
    raw = yaml.safe_load(example.read_text())
    config = config_module.from_mapping(raw)
    assert config.fleet.min_bench_rate == 40
    defaults = config_module.Config()
    for section in ("vast", "fleet", "launch", "timeouts", "reconcile", "agent", "demand", "server", "tunnel", "provers", "sim"):
        assert set(raw[section]) == set(vars(getattr(defaults, section))), section


@pytest.mark.parametrize(
    "text,key",
    [
        ("fleet:\n  min_bench_rte: 3\n", "fleet.min_bench_rte"),
        ("nonsense: 1\n", "nonsense"),
        ("fleet:\n  max_instances: -1\n", "fleet.max_instances"),
        ("fleet:\n  max_instances: 2.5\n", "fleet.max_instances"),
        ("fleet:\n  max_dph: cheap\n", "fleet.max_dph"),
        ("fleet:\n  gpus: RTX 4090\n", "fleet.gpus"),
        ("timeouts:\n  launching: soon\n", "timeouts.launching"),
        ("provider: aws\n", "provider"),
        ("agent:\n  policy: yolo\n", "agent.policy"),
        ("reconcile:\n  max_vanish_fraction: 1.5\n", "reconcile.max_vanish_fraction"),
        ("fleet: 3\n", "fleet"),
    ],
)
def test_bad_keys_and_values_name_the_key(tmp_path, text, key):
    with pytest.raises(BadInput, match=key.replace(".", r"\.")):
        config_module.load(str(write(tmp_path, text)))


def test_invalid_yaml_and_missing_file(tmp_path):
    with pytest.raises(BadInput, match="not valid YAML"):
        config_module.load(str(write(tmp_path, "fleet: [unclosed\n")))
    with pytest.raises(BadInput, match="not found"):
        config_module.load(str(tmp_path / "missing.yaml"))


def test_bad_config_reaches_the_user_as_one_line_exit_2(tmp_path, cli):
    path = write(tmp_path, "fleet:\n  min_bench_rte: 3\n")
    result = cli("--config", str(path), "fleet")
    assert result.code == 2
    assert result.err.startswith(f"error: config file {path}: config key 'fleet.min_bench_rte' is unknown"
                                 " (did you mean 'fleet.min_bench_rate'? known here: ")
    assert result.err.count("\n") == 1


def test_a_typo_far_from_every_key_names_the_file_and_the_keys(tmp_path):
    path = write(tmp_path, "server:\n  zzzz: 1\n")
    with pytest.raises(BadInput) as raised:
        config_module.load(str(path))
    assert str(raised.value).startswith(f"config file {path}: config key 'server.zzzz' is unknown (known here: ")
    assert "did you mean" not in str(raised.value)


BOMB = """\
fleet:
  gpus:
    - &a ["x","x","x","x","x","x","x","x","x"]
    - &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    - &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    - &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    - &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    - &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    - &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    - &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    - &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""  # 9**9 strings once expanded


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path, cli):
    assert len(BOMB.encode()) < 500
    path = write(tmp_path, BOMB)
    with pytest.raises(BadInput, match=r"line 4: YAML aliases \(\*a\) are not allowed"):
        config_module.load(str(path))
    result = cli("--config", str(path), "fleet")
    assert result.code == 2 and result.err.count("\n") == 1 and "aliases" in result.err


def test_a_merge_key_is_an_alias_too(tmp_path):
    text = "timeouts: &t\n  launching: 5m\nagent:\n  <<: *t\n"
    with pytest.raises(BadInput, match="aliases"):
        config_module.load(str(write(tmp_path, text)))


def test_an_anchor_without_alias_is_harmless(tmp_path):
    config = config_module.load(str(write(tmp_path, "fleet: &f\n  max_instances: 3\n")))
    assert config.fleet.max_instances == 3


@pytest.mark.parametrize("text,key,line", [
    ("provider: vast\nprovider: sim\n", "provider", 2),
    ("fleet:\n  max_instances: 3\n  max_dph: 0.5\n  max_instances: 30\n", "fleet.max_instances", 4),
    ("fleet:\n  max_dph: 1\nfleet:\n  max_instances: 4\n", "fleet", 3),
    ("launch:\n  env:\n    A: '1'\n    A: '2'\n", "launch.env.A", 4),
    ("{db: a, db: b}\n", "db", 1),
])
def test_a_duplicate_key_is_an_error_naming_it(tmp_path, text, key, line):
    with pytest.raises(BadInput, match=rf"line {line}: key {key!r} appears twice"):
        config_module.load(str(write(tmp_path, text)))


def test_deep_nesting_is_bad_input_not_a_crash(tmp_path):
    with pytest.raises(BadInput, match="config file"):
        config_module.load(str(write(tmp_path, "a: " + "[" * 100_000 + "]" * 100_000 + "\n")))


@pytest.mark.parametrize("prefix", ["vast\nctl-", "vastctl-\n# x", "vast ctl-", "-vastctl", "v\u202ectl-", "x" * 41])
def test_a_label_prefix_that_could_break_out_of_where_labels_are_written_is_refused(prefix):
    with pytest.raises(BadInput, match="vast.label_prefix' must be 1 to 40 letters, digits"):
        config_module.from_mapping({"vast": {"label_prefix": prefix}})
    assert config_module.from_mapping({"vast": {"label_prefix": "prover-1.a_"}}).vast.label_prefix == "prover-1.a_"
    assert config_module.from_mapping({"vast": {"label_prefix": ""}}).vast.label_prefix == ""


@pytest.mark.parametrize("memory", ["256G", "Auto", " auto", "1.5GiB", "0GiB", "256GiB\nx", "99999999GiB"])
def test_a_cuzk_memory_budget_cuzk_would_misread_is_refused(memory):
    with pytest.raises(BadInput, match="VASTCTL_CUZK_MEMORY' must be auto or a whole size cuzk reads"):
        config_module.from_mapping({"launch": {"env": {"VASTCTL_CUZK_MEMORY": memory}}})


@pytest.mark.parametrize("memory", ["auto", "256GiB", "200000MiB", "256GB", "274877906944", " 64 GiB "])
def test_a_cuzk_memory_budget_cuzk_reads_is_kept(memory):
    config = config_module.from_mapping({"launch": {"env": {"VASTCTL_CUZK_MEMORY": memory}}})
    assert config.launch.env["VASTCTL_CUZK_MEMORY"] == memory
