"""docs/day-one.md, then docs/joining-curio.md, followed in order in the playground (`provider: sim`, docs/demo.md
"Joining and routing in the playground") on one host: the config an operator writes, `init`, `serve` and its
health answer, Curio's demand, the timers' commands, a machine launched, joined, listed by `vastctl provers` and
proving a PoRep call `vastctl route` sent it, and what `fleet`, `events` and `logs` then show.

A step that needs root, systemd, apt, a real sshd or vast itself is named in SKIPPED_IN_PLAYGROUND with why, and
every other step in PLAYED: a step added to either guide fails the first test until it is one or the other.
The commands run in this process on a FastClock (tests/helpers/playground.py); serve and route are processes
of their own on the wall clock, and the stand-in daemon's process proves at the FastClock's pace.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from helpers.playground import FastClock, processes_with
from helpers.serving import free_port, free_port_block, query, stop_process, wait_for

from vastctl.cli.app import Globals
from vastctl.providers import sim_daemon, sim_join
from vastctl.route import wire

pytestmark = pytest.mark.slow  # starts serve, the router and the stand-in daemon's process

ROOT = Path(__file__).resolve().parent.parent
DAY_ONE = ROOT / "docs" / "day-one.md"
JOINING = ROOT / "docs" / "joining-curio.md"
SPEED = 30.0  # simulated seconds per wall second
STEP_S = 120.0  # each boot step: the clock jumps this far, then a reconcile pass (as cron runs it every minute)
ADMIN_TOKEN = "playground-admin-token-0123456789abcdef"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl manager"

# A step of either guide (a text its checklist line or shell line holds) → why the playground cannot take it.
SKIPPED_IN_PLAYGROUND = {
    "Debian 12": "a host with a public DNS name and open ports: the playground is one loopback host",
    "apt-get install": "installs packages (needs root)",
    "A vast.ai API key": "provider: sim rents from no vast and reads no Curio database or image",
    "parameter mirror": "a simulated machine fetches no parameters",
    "vastctl demo --keep": "the demo's own simulated day (tests/test_demo.py), not the playground's market",
    "--db day.db fleet --all": "reads the demo's kept day (tests/test_demo.py)",
    "systemctl": "needs systemd as init (the timers' commands, reconcile and agent-step, run here)",
    "certbot": "a certificate and nginx in front (serve's own /healthz answers here)",
    "daily backup": "cron and a copy off the host (tests/test_deployment_guide.py runs the backup)",
    "vast's webhook": "vast sends it: the playground has no vast",
    "useradd": "creates a system user (needs root)",
    "usermod": "changes a system user (needs root)",
    "install -d -o vastctl": "a directory owned by the vastctl user (needs root); here one of the test's own",
    "cp jobs/sshd-vastctl-tunnel.conf": "sshd's drop-in (needs root): no sshd stands between in the playground",
    "sshd -t": "a real sshd and systemd",
    "/etc/sudoers.d/vastctl-nginx": "a sudoers file (needs root); the reload command here is the test's own",
    "cp jobs/nginx-cuzk-grpc.conf": "nginx, the plain alternative to the router, run here",
    "nginx -t": "nginx, the plain alternative to the router, run here",
    "jobs/vastctl-route.socket": "systemd's socket unit (needs root and systemd): here the router binds route.listen",
    "ListenStream=": "systemd's socket unit (needs root and systemd): here the router binds route.listen",
}

# A step the test takes (a text its checklist line or shell line holds), in the guides' order.
PLAYED = (
    "`vastctl init`",  # and the state file and its secret, both -rw-------
    "`server.url`",  # the config keys, the fleet's limits
    "`demand.command` in the config",
    "`vastctl demand show --json`",
    "launch.join: ssh",  # the tunnel keys file, where tunnel.keys_reader reads it
    "`vastctl provers`",  # the upstream file and its reload command
    "vastctl provers'",  # joining-curio.md's first upstream file, written by `vastctl provers`
    "The proof router",  # `vastctl route` on route.listen: "routing on …"
    "journalctl -u vastctl-route",  # what the router says, read from its output here
    "Curio's `[Cuzk] Address`",  # the PoRep call goes to route.listen
    "target_proofs_per_hour",
    "vastctl launch --gpu",  # events, fleet --json's joined and boot_stages
    "lists it",  # provers lists it; the call finishes on it; proofs/h in fleet
    "/metrics",  # scraped from serve
)


def day_one_steps() -> list[str]:
    """day-one.md's checklist lines, each with its continuation lines."""
    return [" ".join(item.split()) for item in re.findall(r"^- \[ \] (.*?)(?=^- \[ \]|^\*\*|\Z)", DAY_ONE.read_text(),
                                                           flags=re.M | re.S)]


def joining_steps() -> list[str]:
    """joining-curio.md's shell lines, before its playground section (which docs/demo.md's playground is)."""
    text = JOINING.read_text().split("## Trying it offline")[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.M | re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_every_step_of_the_guides_is_played_or_named_skipped():
    steps = day_one_steps() + joining_steps()
    assert len(day_one_steps()) >= 20 and len(joining_steps()) >= 8, steps
    unhandled = [step for step in steps if not any(needle in step for needle in (*SKIPPED_IN_PLAYGROUND, *PLAYED))]
    assert not unhandled, f"steps neither played nor in SKIPPED_IN_PLAYGROUND: {unhandled}"
    unused = [needle for needle in (*SKIPPED_IN_PLAYGROUND, *PLAYED) if not any(needle in step for step in steps)]
    assert not unused, f"no step of the guides holds these any more: {unused}"


@pytest.fixture
def processes(tmp_path, db_path):
    """The processes the test starts (serve, route), stopped at its end however it ends, and the stand-in
    daemon's process gone with them."""
    started: list[subprocess.Popen] = []
    daemons = Path(str(db_path) + sim_join.SUFFIX)
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                stop_process(proc)
        if daemons.exists():  # a test that failed before its kill: the file gone, the process exits by itself
            daemons.unlink()
        wait_for(lambda: not sim_join.running(daemons), "the stand-in process exits")
        wait_for(lambda: not processes_with(str(daemons)), "no stand-in process is left")


def start(processes: list[subprocess.Popen], log: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "vastctl", *args], env={**os.environ}, stdin=subprocess.DEVNULL,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    processes.append(proc)
    return proc


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


def prove(address: str, request_id: str):
    """The call Curio's cuzk client makes: a unary Prove, a PoRep (its C1 output), to its [Cuzk] Address."""
    request = wire.ProveRequest(submit=wire.SubmitProofRequest(
        request_id=request_id, proof_kind=wire.POREP_SEAL_COMMIT, sector_size=32 << 30, vanilla_proof=b"c1" * 512))
    with grpc.insecure_channel(address) as channel:
        data = channel.unary_unary(wire.PROVE)(request.SerializeToString(), timeout=60)
    return wire.ProveResponse.FromString(data).result


def test_day_one_then_joining_curio_in_the_playground(tmp_path, db_path, monkeypatch, cli, processes):
    clock = FastClock(SPEED)
    monkeypatch.setattr(Globals, "system_clock", clock)

    # day-one.md, the manager (deployment.md §1–2): the config, with provider sim in place of vast
    serve_port, route_port, first = free_port(), free_port(), free_port_block(4)
    (tmp_path / "host_key.pub").write_text(HOST_KEY + "\n")
    demand = tmp_path / "demand.json"
    demand.write_text(json.dumps({"queued": 0, "in_flight": 0, "lookahead": 0}))
    reloads = tmp_path / "reloads"
    upstream = tmp_path / "nginx" / "cuzk-upstream.conf"
    upstream.parent.mkdir()
    keys_dir = tmp_path / "vastctl-tunnel"
    keys_dir.mkdir(mode=0o755)  # joining-curio.md: its own directory, 755
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
provider: sim
db: {db_path}
sim:
  seed: 3
  failures: low
server:
  url: http://127.0.0.1:{serve_port}
  admin_token: {ADMIN_TOKEN}
fleet:
  max_instances: 2
  max_dph: 1.0
  max_hourly_spend: 5
demand:
  command: cat {demand}
launch:
  join: ssh
  bench_concurrency: 1
tunnel:
  host: 127.0.0.1
  user: {getpass.getuser()}
  authorized_keys: {keys_dir / "authorized_keys"}
  host_key_file: {tmp_path / "host_key.pub"}
  keys_reader: {getpass.getuser()}
  first_port: {first}
  last_port: {first + 3}
provers:
  upstream_file: {upstream}
  reload_command: echo reloaded >> {reloads}
route:
  listen: 127.0.0.1:{route_port}
  refresh: 0.2
""")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    daemons = Path(str(db_path) + sim_join.SUFFIX)

    initialized = cli("init")
    assert initialized.code == 0, initialized.err
    for made in (db_path, Path(str(db_path) + ".secret")):  # `ls -l` shows both -rw-------
        assert stat.filemode(made.stat().st_mode) == "-rw-------", made

    # `vastctl serve` (nginx's backend): /healthz answers {"ok": true}
    serve_log = tmp_path / "serve.log"
    serve = start(processes, serve_log, "serve", "--port", str(serve_port))
    wait_for(lambda: f"127.0.0.1:{serve_port}" in serve_log.read_text(), "serve listens", proc=serve, log=serve_log)
    status, health = get(f"http://127.0.0.1:{serve_port}/healthz")
    assert (status, json.loads(health)) == (200, {"ok": True})

    # Demand from Curio (curio-demand.md): demand.command prints what curio-demand.sh prints
    shown = cli("demand", "show", "--json")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["known"] is True, shown.out

    # the timers' commands, as systemd runs them: nothing launched while no work waits
    stepped = cli("agent-step", "--if-events")
    assert stepped.code == 0, stepped.err
    assert cli("reconcile").code == 0
    assert query(db_path, "SELECT uuid FROM instances") == []

    # The first machine: a target, then a launch
    assert cli("settings", "set", "target_proofs_per_hour", "40").code == 0
    launched = cli("launch", "--gpu", "RTX 4090", "--json")
    assert launched.code == 0, launched.err
    machine = json.loads(launched.out)["launched"][0]
    label, uuid = machine["label"], machine["uuid"]
    (port,) = [row["tunnel_port"] for row in query(db_path, "SELECT tunnel_port FROM instances WHERE uuid = ?", uuid)]
    assert first <= port <= first + 3
    # joining-curio.md step 1: one restricted line for its port; sshd reads it as tunnel.keys_reader
    keys = (keys_dir / "authorized_keys").read_text()
    assert f'restrict,port-forwarding,permitlisten="127.0.0.1:{port}" ssh-ed25519 ' in keys and keys.rstrip().endswith(label)

    # reconcile, every minute as cron runs it, until the manager's own check finds its daemon at its port
    def joined():
        clock.jump(STEP_S)
        passed = cli("reconcile")
        assert passed.code == 0, passed.err
        return query(db_path, "SELECT joined_at FROM instances WHERE uuid = ? AND state = 'running'", uuid)
    wait_for(joined, f"{label} joins", timeout=120)

    events = cli("events", "--label", label)
    assert events.code == 0, events.err
    changes = [line.split()[4] if "→" in line.split()[:5] else line.split()[2] for line in events.out.splitlines()[1:]]
    said = [change for change in changes if change in ("registered", "params_done", "bench_done", "running", "joined")]
    assert said == ["registered", "params_done", "bench_done", "running", "joined"], events.out  # day-one.md's order
    fleet = {m["label"]: m for m in json.loads(cli("fleet", "--json").out)["instances"]}
    assert fleet[label]["joined"] is True
    assert set(fleet[label]["boot_stages"]) == {"fetch", "daemon", "warmup", "bench", "join"}

    # joining-curio.md step 4: reconcile already wrote the upstream file and reloaded; `vastctl provers` lists it,
    # and with the set unchanged neither rewrites the file nor reloads
    assert f"127.0.0.1:{port}" in upstream.read_text()
    reloaded = reloads.read_text().splitlines()
    assert reloaded and set(reloaded) == {"reloaded"}
    provers = cli("provers", "--json")
    assert provers.code == 0, provers.err
    assert [(p["label"], p["endpoint"]) for p in json.loads(provers.out)["provers"]] == [(label, f"127.0.0.1:{port}")]
    assert reloads.read_text().splitlines() == reloaded

    # the proof router on route.listen, Curio's [Cuzk] Address: a PoRep call proved by the joined machine
    route_log = tmp_path / "route.log"
    router = start(processes, route_log, "route")
    wait_for(lambda: f"routing on 127.0.0.1:{route_port}" in route_log.read_text(), "the router listens", proc=router,
             log=route_log)
    result = prove(f"127.0.0.1:{route_port}", "day-one-1")
    assert result.status == wire.STATUS_COMPLETED, result.error_message
    assert result.proof == sim_daemon.proof_for("day-one-1")
    wait_for(lambda: query(db_path, "SELECT label, kind, result FROM proof_calls") == [
        {"label": label, "kind": "porep", "result": "completed"}], "the router records the call")
    stop_process(router)
    assert router.returncode == 0, route_log.read_text()

    # fleet shows it with proofs/h; logs say what its boot script said; /metrics is scraped from serve
    table = cli("fleet")
    assert table.code == 0 and "proofs/h" in table.out.splitlines()[0] and label in table.out, table.out
    logs = cli("logs", label)
    assert logs.code == 0, logs.err
    assert "vastctl-onstart: stage bench took" in logs.out
    status, metrics = get(f"http://127.0.0.1:{serve_port}/metrics", ADMIN_TOKEN)
    assert status == 200 and b"vastctl_proof_wait_seconds" in metrics

    # done: killed, its stand-in stops serving and its process exits
    killed = cli("kill", label, "--reason", "done with the guides", "--force")
    assert killed.code == 0, killed.err
    wait_for(lambda: not sim_join.running(daemons), "the stand-in process exits")
    stop_process(serve)  # as systemd stops it
    assert serve.returncode == 0, serve_log.read_text()
