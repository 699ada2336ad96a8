"""jobs/curio-demand.sh against a real PostgreSQL holding Curio's tables, and what vastctl makes of it.

The tables are Curio's (schema `curio`, the columns and types its migrations leave:
harmony/harmonydb/sql/20230719-harmony.sql, 20231217-sdr-pipeline.sql and the
later ALTERs, timestamps timestamptz since 20240522), with an empty
`public.harmony_task` beside them as a decoy. The rows cover every kind of task
and sector; the expected counts are computed here from the same rows.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from helpers import pg
from helpers.curio_tables import CURIO_TABLES
from helpers.serving import wait_for

from vastctl.facts import demand

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "curio-demand.sh"
PROVING = {"PoRep", "UpdateProve", "PSProve"}


# (name, owner machine or None, retries): queued, claimed, retried, and names that are not proving work
TASKS = [
    ("PoRep", None, 0), ("PoRep", None, 0), ("PoRep", None, 2),  # the last one failed twice: queued again
    ("UpdateProve", None, 0), ("UpdateProve", None, 1), ("PSProve", None, 0),
    ("PoRep", 1, 0), ("PoRep", 2, 0), ("UpdateProve", 1, 0), ("PSProve", 2, 3),
    ("SDR", None, 0), ("TreeRC", 1, 0), ("WdPost", None, 0), ("WinPost", 2, 0), ("CommitBatch", None, 0),
    ("UpdateEncode", None, 0), ("PSProveX", None, 0), ("porep", None, 0), ("PShareSubmit", None, 0),
]
# (name, minutes before now the run ended, succeeded)
HISTORY = [
    ("PoRep", 2, True), ("PoRep", 30, True), ("UpdateProve", 45, True), ("PSProve", 50, True),
    ("PoRep", 20, False), ("PSProve", 10, False),           # failures in the hour
    ("PoRep", 70, True), ("UpdateProve", 180, True),        # successes before the hour (10 min margins: a slow run)
    ("SDR", 5, True), ("WdPost", 1, True), ("TreeRC", 15, True),  # not proving work
]
# sectors at each stage: (after_precommit_msg, after_precommit_msg_success, porep task, after_porep, failed)
SECTORS = [
    (False, False, False, False, False),  # sealing
    (True, False, False, False, False),   # precommit sent, not on chain
    (True, True, False, False, False),    # precommitted, waiting for the seed: look-ahead
    (True, True, False, False, False),
    (True, True, False, False, False),
    (True, True, True, False, False),     # PoRep task created: counted as queued/in flight, not look-ahead
    (True, True, True, True, False),      # proved
    (True, True, False, True, False),     # proved, task row gone
    (True, True, False, False, True),     # failed after precommit
]


def truth() -> dict:
    """What the script must print, from the rows above."""
    return {
        "queued": sum(1 for name, owner, _ in TASKS if name in PROVING and owner is None),
        "in_flight": sum(1 for name, owner, _ in TASKS if name in PROVING and owner is not None),
        "lookahead": sum(1 for _, landed, task, proved, failed in SECTORS if landed and not task and not proved
                         and not failed),
        "proofs_per_hour": sum(1 for name, ago, ok in HISTORY if name in PROVING and ok and ago < 60),
        "arrivals": [0] * 9,  # no sector above has a seed_epoch: the look-ahead's times are unknown, in no bucket
        "later": sum(1 for _, landed, task, proved, failed in SECTORS if not landed and not task and not proved
                     and not failed),
    }


def _literal(value) -> str:
    return "NULL" if value is None else ("TRUE" if value is True else "FALSE" if value is False else repr(value))


def load_curio(cluster: pg.Cluster, schema: str, *, rows: bool) -> None:
    statements = [f"CREATE SCHEMA {schema}", CURIO_TABLES.format(s=schema),
                  f"INSERT INTO {schema}.harmony_machines (host_and_port, cpu, ram, gpu)"
                  " VALUES ('10.0.0.1:12300', 64, 549755813888, 1), ('10.0.0.2:12300', 32, 274877906944, 1)"]
    if rows:
        for name, owner, retries in TASKS:
            statements.append(f"INSERT INTO {schema}.harmony_task (posted_time, owner_id, added_by, name, retries)"
                              f" VALUES (now() - interval '3 minutes', {_literal(owner)}, 1, '{name}', {retries})")
        for number, (name, ago, ok) in enumerate(HISTORY):
            statements.append(
                f"INSERT INTO {schema}.harmony_task_history (task_id, name, posted, work_start, work_end, result, err,"
                f" completed_by_host_and_port) VALUES ({1000 + number}, '{name}', now() - interval '{ago + 30} minutes',"
                f" now() - interval '{ago + 10} minutes', now() - interval '{ago} minutes', {_literal(ok)},"
                f" {'NULL' if ok else repr('proof failed')}, '10.0.0.1:12300')")
        for number, (sent, landed, task, proved, failed) in enumerate(SECTORS):
            statements.append(
                f"INSERT INTO {schema}.sectors_sdr_pipeline (sp_id, sector_number, reg_seal_proof, after_sdr,"
                f" after_precommit_msg, after_precommit_msg_success, task_id_porep, after_porep, failed)"
                f" VALUES (1000, {number}, 8, TRUE, {_literal(sent)}, {_literal(landed)},"
                f" {5000 + number if task else 'NULL'}, {_literal(proved)}, {_literal(failed)})")
    cluster.sql(";\n".join(statements))


@pytest.fixture(scope="module")
def cluster():
    reason = pg.unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = pg.Cluster()
    try:
        server.start()
        load_curio(server, "curio", rows=True)
        load_curio(server, "curio_idle", rows=False)  # a Curio with nothing to prove
        load_curio(server, "curio_locked", rows=True)  # one test locks it
        # the decoy: what an unqualified query reads on a database whose search_path starts with public
        server.sql("CREATE TABLE public.harmony_task (id serial, owner_id int, name varchar(16))")
        yield server
    finally:
        server.stop()


def script_env(**extra) -> dict:
    """The environment with no libpq variable of the test runner's leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and not k.startswith("CURIO_")}
    return {**env, **extra}


def run_script(**extra) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT)], env=script_env(**extra), capture_output=True, text=True, timeout=60)


def test_the_script_prints_curios_counts(cluster):
    result = run_script(CURIO_DB_URL=cluster.url())
    assert result.returncode == 0 and result.stderr == ""
    assert json.loads(result.stdout) == truth() == {"queued": 6, "in_flight": 4, "lookahead": 3, "proofs_per_hour": 4,
                                                    "arrivals": [0] * 9, "later": 2}
    sample = demand.parse_output(result.stdout)
    assert (sample.queued, sample.in_flight, sample.lookahead, sample.proofs_per_hour) == (6, 4, 3, 4.0)
    assert (sample.arrivals, sample.later) == ((0,) * 9, 2)
    # the fields of before come first and unchanged: a reader of the old line reads this one alike
    assert result.stdout.startswith('{"queued": 6, "in_flight": 4, "lookahead": 3, "proofs_per_hour": 4, ')


def test_the_last_hour_is_the_same_in_any_session_time_zone(cluster):
    for zone in ("Pacific/Kiritimati", "America/Los_Angeles", "UTC"):
        result = run_script(CURIO_DB_URL=cluster.url(), PGTZ=zone)
        assert result.returncode == 0 and json.loads(result.stdout) == truth(), zone


def test_the_schema_is_configurable_and_an_idle_curio_is_all_zero(cluster):
    result = run_script(CURIO_DB_URL=cluster.url(), CURIO_DB_SCHEMA="curio_idle")
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"queued": 0, "in_flight": 0, "lookahead": 0, "proofs_per_hour": 0,
                                         "arrivals": [0] * 9, "later": 0}


def test_the_sector_size_leaves_out_porep_work_on_sectors_of_the_other_size(cluster):
    """launch.sector_size reaches the script as VASTCTL_SECTOR_SIZE: a 32 GiB fleet never sizes to 64 GiB PoRep."""
    cluster.sql("CREATE SCHEMA curio_sizes;" + CURIO_TABLES.format(s="curio_sizes") + ";"
                "INSERT INTO curio_sizes.harmony_task (id, posted_time, added_by, name) VALUES"
                " (1, now(), 1, 'PoRep'), (2, now(), 1, 'PoRep'), (3, now(), 1, 'UpdateProve');"
                "INSERT INTO curio_sizes.sectors_sdr_pipeline (sp_id, sector_number, reg_seal_proof,"
                " after_precommit_msg, after_precommit_msg_success, task_id_porep) VALUES"
                " (1, 1, 8, TRUE, TRUE, 1), (1, 2, 9, TRUE, TRUE, 2),"  # a PoRep task each: 32 GiB, 64 GiB
                " (1, 3, 18, TRUE, TRUE, NULL), (1, 4, 14, TRUE, TRUE, NULL), (1, 5, 4, TRUE, TRUE, NULL)")  # coming
    counts = {}
    for size in ("", "32GiB", "64GiB"):
        result = run_script(CURIO_DB_URL=cluster.url(), CURIO_DB_SCHEMA="curio_sizes", VASTCTL_SECTOR_SIZE=size)
        assert result.returncode == 0, result.stderr
        counts[size] = json.loads(result.stdout)
    assert [(c["queued"], c["lookahead"]) for c in counts.values()] == [(3, 3), (2, 1), (2, 2)]
    result = run_script(CURIO_DB_URL=cluster.url(), CURIO_SECTOR_SIZE="32G")
    assert result.returncode == 1 and result.stderr.startswith("curio-demand: sector size '32G' is not 32GiB or 64GiB")


# --- when the look-ahead arrives: each sector's seed_epoch against the chain's height --------------------------------

MAINNET_GENESIS = 1598306400  # 2020-08-24T22:00:00Z
CALIBNET_GENESIS = 1667326380  # 2022-11-01T18:13:00Z
HEIGHT = 5_000_000
# (epochs from HEIGHT to the PoRep task's creation, seed_epoch + 3; reg_seal_proof; the bucket it is in, or None)
COMING = [
    (-40, 8, 0),    # due since 20 min (Curio's poller has not made the task yet): the first bucket
    (0, 8, 0),      # due at this height
    (19, 8, 0),     # 9.5 min from now
    (20, 8, 1),     # 10 min: the second
    (47, 18, 2),    # a synthetic-PoRep one, 23.5 min
    (147, 8, 7),    # a precommit that landed just now: 150 epochs, its seed 3 before the task
    (179, 13, 8),   # 89.5 min: the last
    (180, 8, None),  # 90 min: past the buckets, counted in lookahead only
    (40, 9, 2),     # a 64 GiB sector, 20 min
]


@pytest.fixture(scope="module")
def coming(cluster):
    """Sectors of every stage with their seed epochs around HEIGHT, in schema curio_coming."""
    rows = [f"(1, {n}, {proof}, TRUE, TRUE, TRUE, {HEIGHT + ahead - 3}, NULL, FALSE, FALSE)"
            for n, (ahead, proof, _) in enumerate(COMING)]
    rows += [
        "(1, 100, 8, TRUE, TRUE, TRUE, NULL, NULL, FALSE, FALSE)",           # on chain, no seed_epoch yet: lookahead only
        f"(1, 101, 8, TRUE, TRUE, TRUE, {HEIGHT - 10}, 7001, FALSE, FALSE)",  # its task made: queued, not coming
        f"(1, 102, 8, TRUE, TRUE, TRUE, {HEIGHT + 5}, NULL, FALSE, TRUE)",    # failed
        "(1, 200, 8, FALSE, FALSE, FALSE, NULL, NULL, FALSE, FALSE)",        # SDR running: later
        "(1, 201, 8, TRUE, FALSE, FALSE, NULL, NULL, FALSE, FALSE)",         # trees done: later
        "(1, 202, 8, TRUE, TRUE, FALSE, NULL, NULL, FALSE, FALSE)",          # precommit sent, not on chain: later
        "(1, 203, 9, TRUE, TRUE, FALSE, NULL, NULL, FALSE, FALSE)",          # the same, 64 GiB
        "(1, 204, 8, TRUE, FALSE, FALSE, NULL, NULL, FALSE, TRUE)",          # failed in SDR: nothing
    ]
    cluster.sql("CREATE SCHEMA curio_coming;" + CURIO_TABLES.format(s="curio_coming") + ";"
                "INSERT INTO curio_coming.sectors_sdr_pipeline (sp_id, sector_number, reg_seal_proof, after_sdr,"
                " after_tree_r, after_precommit_msg, seed_epoch, task_id_porep, after_precommit_msg_success, failed)"
                " VALUES " + ", ".join(rows) + ";"
                "UPDATE curio_coming.sectors_sdr_pipeline SET after_precommit_msg_success = TRUE"
                " WHERE sector_number < 200 AND NOT failed OR sector_number = 102")
    return cluster


def buckets(sizes=(3, 4, 8, 9, 13, 14, 18, 19), epochs_later=0) -> list[int]:
    """The counts for the sectors of `sizes`, at a height `epochs_later` past HEIGHT."""
    counts = [0] * 9
    for ahead, proof, bucket in COMING:
        ahead -= epochs_later
        assert epochs_later or bucket == (max(0, ahead // 20) if ahead < 180 else None)  # the table's own sums
        if ahead < 180 and proof in sizes:
            counts[max(0, ahead // 20)] += 1
    return counts


def run_at(cluster, now: int, **env) -> dict:
    result = run_script(CURIO_DB_URL=cluster.url(), CURIO_DB_SCHEMA="curio_coming", CURIO_NOW_UNIX=str(now), **env)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return json.loads(result.stdout)


def test_each_coming_sector_is_in_the_bucket_of_its_porep_tasks_creation(coming):
    for into_the_epoch in (0, 29):  # the height is whole epochs since genesis
        shown = run_at(coming, MAINNET_GENESIS + HEIGHT * 30 + into_the_epoch)
        assert shown["arrivals"] == buckets() == [3, 1, 2, 0, 0, 0, 0, 1, 1], into_the_epoch
        assert shown["lookahead"] == len(COMING) + 1  # past the buckets and without a seed: look-ahead all the same
        assert shown["later"] == 4 and shown["queued"] == 0
    assert demand.parse_output(json.dumps(shown)).arrivals == (3, 1, 2, 0, 0, 0, 0, 1, 1)
    one_epoch_on = run_at(coming, MAINNET_GENESIS + (HEIGHT + 1) * 30)
    assert one_epoch_on["arrivals"] == buckets(epochs_later=1) == [4, 1, 1, 0, 0, 0, 0, 1, 2]  # 20 away is 19, 180 is 179
    assert run_at(coming, MAINNET_GENESIS + (HEIGHT + 1) * 30 - 1)["arrivals"] == buckets()


def test_the_genesis_is_settable_for_calibration_net(coming):
    shown = run_at(coming, CALIBNET_GENESIS + HEIGHT * 30, CURIO_GENESIS_UNIX=str(CALIBNET_GENESIS))
    assert shown["arrivals"] == buckets()
    mainnet_clock = run_at(coming, CALIBNET_GENESIS + HEIGHT * 30)  # mainnet's genesis: a height 2.3 million higher
    assert mainnet_clock["arrivals"] == [len(COMING)] + [0] * 8  # every one looks overdue


def test_the_sector_size_holds_for_arrivals_and_later(coming):
    now = MAINNET_GENESIS + HEIGHT * 30
    small = run_at(coming, now, VASTCTL_SECTOR_SIZE="32GiB")
    large = run_at(coming, now, VASTCTL_SECTOR_SIZE="64GiB")
    assert (small["arrivals"], small["later"]) == (buckets((3, 8, 13, 18)), 3)
    assert (large["arrivals"], large["later"]) == (buckets((4, 9, 14, 19)), 1) == ([0, 0, 1, 0, 0, 0, 0, 0, 0], 1)


@pytest.mark.parametrize("env, why", [
    ({"CURIO_NOW_UNIX": "soon"}, "CURIO_GENESIS_UNIX and CURIO_NOW_UNIX are unix seconds"),
    ({"CURIO_NOW_UNIX": "-5"}, "got '-5'"),
    ({"CURIO_NOW_UNIX": "1e9"}, "got '1e9'"),
    ({"CURIO_NOW_UNIX": "9" * 13}, "are unix seconds"),
    ({"CURIO_GENESIS_UNIX": "1667326380; DROP TABLE x"}, "are unix seconds"),
    ({"CURIO_GENESIS_UNIX": " 1667326380"}, "got ' 1667326380'"),
    ({"CURIO_NOW_UNIX": "1598306399"}, "now (1598306399) is before the genesis, CURIO_GENESIS_UNIX (1598306400)"),
])
def test_a_bad_clock_or_genesis_is_refused_before_psql_runs(coming, env, why):
    result = run_script(CURIO_DB_URL=coming.url(), CURIO_DB_SCHEMA="curio_coming", **env)
    assert result.returncode == 1 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith("curio-demand: ") and why in result.stderr


def test_the_connection_parts_build_the_url(cluster):
    result = run_script(CURIO_DB_HOST="127.0.0.1", CURIO_DB_PORT=str(cluster.port), CURIO_DB_USER=pg.USER,
                        CURIO_DB_PASSWORD=pg.PASSWORD, CURIO_DB_NAME="postgres")
    assert result.returncode == 0 and json.loads(result.stdout) == truth()


@pytest.mark.parametrize("password", ["p@ss", "a/b", "pc%41t", "x:y?z#w", "sp ace&'quote"])
def test_a_password_is_taken_as_written_as_curio_takes_it(cluster, password):
    role = "curio_pw_" + str(abs(hash(password)) % 10_000)
    quoted = password.replace("'", "''")
    cluster.sql(f"DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD '{quoted}' SUPERUSER")
    result = run_script(CURIO_DB_HOST="127.0.0.1", CURIO_DB_PORT=str(cluster.port), CURIO_DB_USER=role,
                        CURIO_DB_PASSWORD=password, CURIO_DB_NAME="postgres")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == truth()
    wrong = run_script(CURIO_DB_HOST="127.0.0.1", CURIO_DB_PORT=str(cluster.port), CURIO_DB_USER=role,
                       CURIO_DB_PASSWORD=password + "-not", CURIO_DB_NAME="postgres")
    assert wrong.returncode == 1 and wrong.stderr.startswith("curio-demand: authentication failed: ")


def test_a_host_list_takes_the_port_on_every_host(cluster):
    # Curio's CURIO_DB_HOST is a comma-separated list and CURIO_DB_PORT the port of each; nothing listens on
    # the first host's default port, so a port given to the last host only would not connect
    for hosts in ("127.0.0.1,127.0.0.2", "127.0.0.2,127.0.0.1"):
        result = run_script(CURIO_DB_HOST=hosts, CURIO_DB_PORT=str(cluster.port), CURIO_DB_USER=pg.USER,
                            CURIO_DB_PASSWORD=pg.PASSWORD, CURIO_DB_NAME="postgres")
        assert result.returncode == 0, (hosts, result.stderr)
        assert json.loads(result.stdout) == truth()


def test_the_grants_docs_curio_demand_md_lists_are_enough(cluster):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "curio-demand.md").read_text()
    grants = doc.split("```sql\n", 1)[1].split("```", 1)[0]
    cluster.sql(grants.replace("'SECRET'", "'reader-password'"))
    url = cluster.url().replace(f"{pg.USER}:{pg.PASSWORD}@", "vastctl_demand:reader-password@")
    result = run_script(CURIO_DB_URL=url)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == truth()
    denied = run_script(CURIO_DB_URL=url, CURIO_DB_SCHEMA="curio_idle")
    assert denied.returncode == 1 and denied.stderr.startswith("curio-demand: permission denied: ")


@pytest.mark.parametrize("schema", ["curio; DROP TABLE curio.harmony_task", "1curio", "cu-rio", "curio.x", "curio x"])
def test_a_schema_that_is_not_a_plain_identifier_is_refused_before_psql_runs(cluster, schema):
    result = run_script(CURIO_DB_URL=cluster.url(), CURIO_DB_SCHEMA=schema)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "is not a plain identifier" in result.stderr
    assert cluster.sql("SELECT count(*) FROM curio.harmony_task") == str(len(TASKS))


# --- through demand.command: what vastctl keeps and shows ----------------------------------------------------------


@pytest.fixture
def show(ready, cli, tmp_path, monkeypatch):
    """Set demand.command, run `vastctl demand show --json`; returns the view and the seconds it took."""
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    for name in [n for n in os.environ if n.startswith("PG") or n.startswith("CURIO_")]:
        monkeypatch.delenv(name)

    def run(command: str) -> tuple[dict, float]:
        config.write_text(yaml.safe_dump({"demand": {"command": command}}))
        started = time.monotonic()
        result = cli("demand", "show", "--json")
        assert result.code == 0, result.err
        return json.loads(result.out), time.monotonic() - started

    return run


def command(url: str, **env) -> str:
    settings = " ".join(f"{name}={value}" for name, value in {"CURIO_DB_URL": url, **env}.items())
    return f"{settings} {SCRIPT}"


def test_demand_command_keeps_every_count(cluster, show, store):
    view, _ = show(command(cluster.url()))
    assert view["known"] and view["error"] is None and view["source"] == "command"
    assert {k: view[k] for k in truth()} == {**truth(), "proofs_per_hour": float(truth()["proofs_per_hour"])}
    row = store.execute("SELECT queued, in_flight, lookahead, proofs_per_hour, ok FROM demand_samples").fetchone()
    assert tuple(row) == (6, 4, 3, 4.0, 1)


def test_an_empty_queue_is_known_and_zero(cluster, show):
    view, _ = show(command(cluster.url(), CURIO_DB_SCHEMA="curio_idle"))
    assert view["known"] and (view["queued"], view["in_flight"], view["lookahead"]) == (0, 0, 0)


def _silent_port() -> socket.socket:
    """A TCP port that accepts connections and never says a word (a database host that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener


@pytest.mark.parametrize("case, cause", [
    ("server down", "curio-demand: cannot connect: psql: error: connection to server at"),
    ("wrong password", "curio-demand: authentication failed"),
    ("missing schema", "curio-demand: missing schema or table (CURIO_DB_SCHEMA is 'curio_gone')"),
    ("psql missing", "curio-demand: psql not found on PATH"),
    ("non-JSON output", "demand.command printed no JSON"),
    ("a host that never answers", "curio-demand: cannot connect: timeout (5 s)"),
])
def test_each_failure_is_unknown_demand_with_its_cause(cluster, show, store, case, cause):
    silent = _silent_port() if case == "a host that never answers" else None
    commands = {
        "server down": lambda: command(cluster.url(port=pg._free_port())),
        "wrong password": lambda: command(cluster.url(password="not-the-password")),
        "missing schema": lambda: command(cluster.url(), CURIO_DB_SCHEMA="curio_gone"),
        "psql missing": lambda: command(cluster.url(), PATH="/nonexistent"),
        "non-JSON output": lambda: f"psql -X '{cluster.url()}' -c 'SELECT count(*) AS queued FROM curio.harmony_task'",
        "a host that never answers": lambda: command(cluster.url(port=silent.getsockname()[1])),
    }
    try:
        view, took = show(commands[case]())
    finally:
        if silent:
            silent.close()
    assert not view["known"] and view["queued"] is None and view["in_flight"] is None
    assert cause in view["error"], view["error"]
    if case != "non-JSON output":
        assert view["error"].startswith("demand.command exited 1: curio-demand: ")
    assert took < demand.COMMAND_TIMEOUT_S  # the script gave up on its own, vastctl did not have to kill it
    assert [tuple(r) for r in store.execute("SELECT ok, queued FROM demand_samples")] == [(0, None)]
    assert "yugabyte-test-password" not in view["error"]


def _backends(cluster: pg.Cluster, application: str) -> list[tuple[str, str]]:
    rows = cluster.sql(f"SELECT state, coalesce(wait_event_type, '') FROM pg_stat_activity"
                       f" WHERE application_name = '{application}'")
    return [tuple(line.split("|")) for line in rows.splitlines() if line]


def test_a_locked_table_times_out_and_leaves_no_backend_waiting(cluster, show):
    holder = cluster.session("BEGIN; LOCK TABLE curio_locked.harmony_task IN ACCESS EXCLUSIVE MODE;")
    try:
        wait_for(lambda: cluster.sql(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.granted AND"
            " l.mode = 'AccessExclusiveLock' AND l.relation = 'curio_locked.harmony_task'::regclass"
            " AND a.application_name = 'vastctl-test-holder'") == "1", what="the lock to be held", timeout=15)
        view, took = show(command(cluster.url(), CURIO_DB_SCHEMA="curio_locked"))
        assert not view["known"] and "curio-demand: timeout: waited 5 s for a lock" in view["error"]
        assert 4 < took < demand.COMMAND_TIMEOUT_S
        # the lock is still held: our backend must have ended by itself, not be queued behind it
        wait_for(lambda: _backends(cluster, "curio-demand") == [], what="our backend to end", timeout=5)
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


def test_a_statement_past_its_timeout_is_cancelled(cluster, show):
    """A harmony_task that takes 30 s to read (a view over pg_sleep) is cancelled at the 10 s statement_timeout."""
    cluster.sql("CREATE SCHEMA curio_slow;"
                "CREATE VIEW curio_slow.harmony_task AS SELECT t.* FROM curio.harmony_task t, pg_sleep(30) s;"
                "CREATE VIEW curio_slow.harmony_task_history AS SELECT * FROM curio.harmony_task_history;"
                "CREATE VIEW curio_slow.sectors_sdr_pipeline AS SELECT * FROM curio.sectors_sdr_pipeline")
    view, took = show(command(cluster.url(), CURIO_DB_SCHEMA="curio_slow"))
    assert not view["known"] and "curio-demand: timeout: the query ran past 10 s" in view["error"]
    assert 9 < took < demand.COMMAND_TIMEOUT_S
    assert _backends(cluster, "curio-demand") == [] or wait_for(
        lambda: _backends(cluster, "curio-demand") == [], what="our backend to end", timeout=5)
