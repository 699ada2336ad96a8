"""docs/deployment.md, then docs/curio-demand.md, then docs/joining-curio.md, in that order and as written, on one
sandboxed host: the guides' own commands (from the fenced blocks of the sections they are in), Debian's real
sshd and nginx on the files the guides install, a real PostgreSQL holding Curio's tables, and at the end a
machine launched at the fake vast that boots under bash, joins through its tunnel and answers a gRPC call made
through nginx (joining-curio.md's plain alternative to `vastctl route` as Curio's address, on a port of its own;
the router has tests of its own).

The sandbox root stands for `/`: anyone may enter it (755), so a directory the guides make that sshd's
keys reader (`nobody`, as shipped) cannot enter fails here as it would on a real host. Each guide's own tests
check its parts alone; this one checks that they fit together. Every line the sandbox does not run as written
is either named in SKIPPED with the reason, or stood in for (STOOD_IN) by what the test does instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers import pg
from helpers.boot import GATE
from helpers.curio_tables import CURIO_TABLES
from helpers.deployment_sandbox import Sandbox
from helpers.fake_vast import KEY, FakeVast
from helpers.joining_machine import JoiningMachine
from helpers.serving import free_port, free_port_block, on_a_thread, query, stop_process, wait_for
from helpers.tunnel_parts import FakeDaemon, Nginx, Sshd, health_check

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SERVE_UNIT = ROOT / "jobs" / "vastctl-serve.service"

# Lines the sandbox does not run, and why (a new command in the sections this test follows must run here, be
# stood in for below, or be named here).
SKIPPED = {
    "apt-get install": "installs packages (the test host has them)",
    "useradd": "creates a system user (the tunnel tests' account stands in for vastctl-tunnel)",
    "usermod": "changes a system user",
    "python3 -m venv /opt/vastctl": "installs into /opt (this test runs the installed vastctl)",
    "/opt/vastctl/bin/pip": "installs into /opt",
    "ln -sf /opt/vastctl/bin/vastctl": "links into /usr/local/bin",
    "install -m 755 jobs/curio-demand.sh": "deployment.md's copy; curio-demand.md installs it again, into the sandbox",
    "sudoedit": "an editor",
    "systemctl": "needs systemd as init",
}
# Lines that need a tool the host may lack (.ci/run installs it): run when it is there, else skipped.
NEEDS = {"visudo": "visudo"}
# Lines the test does in its own way, as the guide means them: the real daemons on sandboxed files and ports.
STOOD_IN = {
    "sshd -t": "sshd -t, then sshd -D, on the installed tunnel config (Sshd)",
    "nginx -t": "nginx -t, then nginx, on the installed balancer config (Nginx)",
    "@yb.internal": "the script run by hand, against the test's PostgreSQL",
    "vastctl provers'": "run as written, expecting the failed reload the guide announces",
}
MOVED = ("/etc/vastctl", "/var/lib/vastctl-tunnel", "/var/lib/vastctl", "/var/log/vastctl", "/etc/nginx", "/etc/ssh/sshd_config.d",
         "/etc/sudoers.d", "/usr/local/bin/curio-demand.sh")


def section(doc: str, heading: str) -> str:
    """The text under `## heading…` up to the next `## `: a section added or renamed elsewhere changes nothing."""
    text = (DOCS / doc).read_text()
    match = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"{doc} has no section '## {heading}'"
    return match.group(1)


def blocks(text: str, lang: str) -> list[str]:
    return [body for fence, body in re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S) if fence == lang]


def lines(text: str) -> list[str]:
    """The shell lines of a text's ```sh blocks, continuations joined, comments dropped."""
    found = []
    for block in blocks(text, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(re.sub(r"\s+#.*$", "", line.strip()))
    return found


def merge(config: Path, addition: str, **replace: str) -> None:
    """A yaml block of a guide put into the installed config, key by key, as an operator's edit would."""
    for old, new in replace.items():
        assert old in addition, old
        addition = addition.replace(old, new)
    text = yaml.safe_load(config.read_text())
    for key, value in yaml.safe_load(addition).items():
        if isinstance(value, dict):
            text.setdefault(key, {}).update(value)
        else:
            text[key] = value
    config.write_text(yaml.safe_dump(text, sort_keys=False))


class Host(Sandbox):
    """The deployment guide's sandbox, with the paths the other two guides add."""

    def moved(self, text: str) -> str:
        for prefix in MOVED:
            text = re.sub(rf"(?<![\w/.]){re.escape(prefix)}(?=[/\s'\"]|$)", str(self.root) + prefix, text)
        return text

    def runnable(self, line: str) -> str | None:
        """The line as the sandbox runs it: sudo and file owners dropped (there is no vastctl user here)."""
        if any(needle in line for needle in SKIPPED) or any(
                needle in line and shutil.which(tool) is None for needle, tool in NEEDS.items()):
            self.skipped.append(line)
            return None
        line = re.sub(r"^sudo (-u vastctl )?", "", line)
        line = re.sub(r" -[og] \S+", "", line) if line.startswith("install ") else line
        assert not re.search(r"\bsudo\b", line), line
        return self.moved(line)

    def follow(self, text: str) -> list[tuple[str, subprocess.CompletedProcess | None]]:
        """Run a guide's shell lines in order: each with what it printed, or None when skipped or stood in for
        (the caller does those)."""
        done: list[tuple[str, subprocess.CompletedProcess | None]] = []
        for line in lines(text):
            if any(needle in line for needle in STOOD_IN):
                done.append((line, None))
                continue
            runnable = self.runnable(line)
            if runnable is None:
                continue
            done.append((line, self.sh(runnable)))
            if "/etc/vastctl/" in line and line.startswith(("sudo install", "install")):
                self.move_paths_inside(Path(runnable.split()[-1]))
        return done

    def stood_in(self, text: str) -> list[str]:
        return [line for line, result in self.follow(text) if result is None]

    def as_vastctl(self, command: str, *, check: bool = True) -> subprocess.CompletedProcess:
        """A command as the guides run it by hand: as the vastctl user with the environment file."""
        return self.sh(self.moved(f"set -a; . /etc/vastctl/env; {command}"), check=check)


@pytest.fixture
def host():
    """A root anyone may enter, as / is (pytest's own temporary directories are root's alone), short enough for
    ssh's control socket under it; with the directories Debian's packages make."""
    top = Path(tempfile.mkdtemp(prefix="vg-", dir="/tmp"))
    top.chmod(0o755)
    made = Host(top / "h")
    made.root.chmod(0o755)
    for directory in ("etc/ssh/sshd_config.d", "etc/nginx/conf.d", "etc/sudoers.d", "usr/local/bin"):
        (made.root / directory).mkdir(parents=True, mode=0o755)
    yield made
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def vast():
    with on_a_thread(FakeVast()) as server:
        yield server


class GuideManager:
    """The manager the guides set up, as the tunnel tests' machine harness reads it."""

    def __init__(self, host: Host, port: int):
        self.host, self.port = host, port
        self.db_path = host.db
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VASTCTL_", "VAST_", "ANTHROPIC_"))}
        # the harness's commands merge the test process's environment (VASTCTL_DB among it): name the guide's file
        self.env = {**env, **host.env, "VASTCTL_CONFIG": str(host.path("/etc/vastctl/config.yaml")),
                    "VASTCTL_DB": str(host.db)}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rows(self) -> dict[str, dict]:
        return {row["uuid"]: row for row in query(self.db_path, "SELECT * FROM instances")}


def serve(host: Host, port: int) -> subprocess.Popen:
    """The serve unit's ExecStart with its environment file (section 3 of deployment.md starts the unit)."""
    exec_start = re.search(r"^ExecStart=(.*)$", SERVE_UNIT.read_text(), flags=re.M).group(1)
    command = exec_start.replace("/usr/local/bin/vastctl", "vastctl").replace("--port 8080", f"--port {port}")
    log = host.root / "serve.log"
    proc = subprocess.Popen(["sh", "-c", host.moved(f"set -a; . /etc/vastctl/env; exec {command}")], env=host.env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    wait_for(lambda: "serving on" in log.read_text(), "serve starts", proc=proc, log=log)
    return proc


def deployment(host: Host, vast_url: str, serve_port: int) -> None:
    """Sections 1 and 2 as written, then section 1's edit of the config (the test's addresses and boot knobs)."""
    host.follow(section("deployment.md", "1. Install"))
    host.follow(section("deployment.md", "2. The environment file"))
    config = host.path("/etc/vastctl/config.yaml")
    launch_env = {"VASTCTL_HEARTBEAT_S": "0.3", "VASTCTL_CUZK_WAIT_S": "60", "VASTCTL_RETRY_FOR": "10s"}
    merge(config, json.dumps({
        "server": {"url": f"http://127.0.0.1:{serve_port}"},
        "fleet": {"min_bench_rate": GATE, "max_dph": 1.0},
        "launch": {"vastctl_source": "vastctl==0.1.0", "install": "true", "bench_count": 4, "bench_concurrency": 2,
                   "env": launch_env}}))
    env_file = host.path("/etc/vastctl/env")
    env_file.write_text(env_file.read_text().replace("VAST_API_KEY=\n", f"VAST_API_KEY={KEY}\nVAST_API_URL={vast_url}\n"))


def curio_demand(host: Host, cluster: pg.Cluster) -> dict:
    """The section in order: the script installed, the config, the grants, the check by hand."""
    cluster.sql("CREATE SCHEMA curio;" + CURIO_TABLES.format(s="curio"))
    cluster.sql("INSERT INTO curio.harmony_task (posted_time, added_by, name) VALUES"
                " (now(), 1, 'PoRep'), (now(), 1, 'PoRep'), (now(), 1, 'UpdateProve')")
    text = section("curio-demand.md", "Pointing it at the database")
    (grants,) = blocks(text, "sql")
    cluster.sql(grants)
    (demand_yaml,) = blocks(text, "yaml")
    url = f"postgres://vastctl_demand:SECRET@127.0.0.1:{cluster.port}/postgres"
    merge(host.path("/etc/vastctl/config.yaml"), demand_yaml,
          **{"postgres://yugabyte:SECRET@yb.internal:5433/yugabyte": url,
             "/usr/local/bin/curio-demand.sh": str(host.path("/usr/local/bin/curio-demand.sh"))})
    done = host.follow(text)
    assert [line.split()[0] for line, _ in done] == [
        "install", "CURIO_DB_URL=postgres://vastctl_demand:SECRET@yb.internal:5433/yugabyte", "sudo"], done
    by_hand = done[1][0]
    counts = json.loads(host.sh(host.moved(by_hand.replace(by_hand.split()[0], f"CURIO_DB_URL={url}"))).stdout)
    assert counts["queued"] == 3, counts
    return json.loads(done[2][1].stdout)


def nginx_reload_command(home: Path) -> str:
    """What the test's nginx (tunnel_parts.Nginx in `home`) is reloaded with: the guide's sudo line stands for it."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    return f"{binary} -p {home} -e {home}/error.log -c {home}/nginx.conf -s reload"


def joining(host: Host) -> tuple[Sshd, Nginx, Path]:
    """The setting-up section in order, the daemons started where the guide reloads them."""
    text = section("joining-curio.md", "Setting it up")
    sh_blocks = [block.join(["```sh\n", "```\n"]) for block in blocks(text, "sh")]
    assert [line.split(" && ")[0] for line in host.stood_in(sh_blocks[0])] == ["sshd -t"]
    installed = host.path("/etc/ssh/sshd_config.d/vastctl-tunnel.conf")
    keys = host.path("/var/lib/vastctl-tunnel/authorized_keys")
    sshd = Sshd(host.root / "sshd", keys, shipped=host.moved(installed.read_text()), reader="nobody")
    (tunnel_yaml,) = blocks(text, "yaml")
    upstream = host.path("/etc/nginx/vastctl/cuzk-upstream.conf")
    nginx_home = host.root / "nginx"
    first = free_port_block(21)
    merge(host.path("/etc/vastctl/config.yaml"), tunnel_yaml, **{
        "manager.example.net": "127.0.0.1", "ssh_port: 22": f"ssh_port: {sshd.port}",
        "user: vastctl-tunnel": f"user: {sshd.user}", "/etc/ssh/ssh_host_ed25519_key.pub": str(sshd.host_public_key),
        "first_port: 20000": f"first_port: {first}", "last_port: 20999": f"last_port: {first + 20}",
        "/var/lib/vastctl-tunnel/authorized_keys": str(keys), "/etc/nginx/vastctl/cuzk-upstream.conf": str(upstream),
        "sudo -n /usr/sbin/nginx -s reload": nginx_reload_command(nginx_home)})
    left = [line for block in sh_blocks[1:] for line in host.stood_in(block)]
    assert [line.split(" && ")[0] for line in left][-2:] == [
        "sudo -u vastctl sh -c 'set -a; . /etc/vastctl/env; vastctl provers'", "nginx -t"], left
    first_list = host.sh(host.runnable(left[-2]), check=False)
    assert first_list.returncode == 1 and "reload" in first_list.stderr, first_list.stderr  # as the guide says
    assert upstream.exists()  # the file stays: nginx's include exists before nginx loads the site
    site = host.path("/etc/nginx/conf.d/vastctl-cuzk.conf").read_text()
    nginx = Nginx(nginx_home, upstream, site=site)
    assert nginx.reload_command == nginx_reload_command(nginx_home)
    return sshd, nginx.start(), upstream


@pytest.mark.slow
def test_the_three_guides_in_order_end_with_a_joined_machine_answering_curios_call(host, vast):
    if (reason := pg.unavailable_reason()) is not None:
        pytest.skip(reason)
    serve_port = free_port()
    deployment(host, vast.url, serve_port)
    cluster = pg.Cluster().start()
    started: list = []
    try:
        shown = curio_demand(host, cluster)
        assert shown["known"] is True and shown["queued"] == 3, shown
        started.append(serve(host, serve_port))
        sshd, nginx, upstream = joining(host)
        started += [sshd, nginx]
        manager = GuideManager(host, serve_port)
        daemon = FakeDaemon("a")
        started.append(daemon)
        homes = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
        machine = JoiningMachine(manager, vast, homes / "a", daemon).join()
        started.append(machine)
        machine.wait_for(lambda r: r["state"] == "running", "the machine joined and reports running", timeout=120)
        listed = host.as_vastctl("vastctl provers --json", check=False)
        assert json.loads(listed.stdout)["provers"][0]["label"] == machine.label, listed.stderr
        port = machine.current()["tunnel_port"]
        assert f"server 127.0.0.1:{port} " in upstream.read_text()
        wait_for(lambda: _answered(nginx.port), "a gRPC call to nginx is answered by the machine", timeout=30)
        assert daemon.calls >= 1
        keys = host.path("/var/lib/vastctl-tunnel/authorized_keys")
        reader = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", str(keys)],
                                capture_output=True, text=True, check=False)
        assert reader.returncode == 0 and f'permitlisten="127.0.0.1:{port}"' in reader.stdout, reader.stderr
        assert "Accepted publickey for" in sshd.log.read_text()
    finally:
        for part in reversed(started):
            part.stop() if not isinstance(part, subprocess.Popen) else stop_process(part)
        cluster.stop()
    assert any(line.startswith("useradd") for line in host.skipped)
    sudoers = host.path("/etc/sudoers.d/vastctl-nginx")  # the line provers.reload_command needs, as written
    assert sudoers.read_text() == "vastctl ALL=(root) NOPASSWD: /usr/sbin/nginx -s reload\n"
    if shutil.which("visudo"):  # .ci/run installs sudo: the chmod and visudo -cf line ran and passed
        assert not any("visudo" in line for line in host.skipped) and sudoers.stat().st_mode & 0o777 == 0o440


def _answered(port: int) -> bool:
    import grpc

    try:
        return health_check(port) == "SERVING"
    except grpc.RpcError:
        return False


@pytest.mark.slow
def test_keys_under_the_state_files_directory_would_refuse_every_launch(host, vast):
    """What the in-order test guards: with the keys where the guides once put them (/var/lib/vastctl, 750 by
    deployment.md), sshd's reader cannot reach them; launch says so and rents nothing."""
    deployment(host, vast.url, free_port())
    config = host.path("/etc/vastctl/config.yaml")
    merge(config, json.dumps({"launch": {"join": "ssh"}, "tunnel": {
        "host": "127.0.0.1", "authorized_keys": str(host.path("/var/lib/vastctl/tunnel/authorized_keys")),
        "host_key_file": str(_host_key(host.root))}}))
    assert host.path("/var/lib/vastctl").stat().st_mode & 0o777 == 0o750
    launched = host.as_vastctl("vastctl launch --gpu 'RTX 4090'", check=False)
    assert launched.returncode == 1 and launched.stderr.count("\n") == 1, launched.stderr
    assert "sshd reads tunnel.authorized_keys as the account nobody" in launched.stderr
    assert f"cannot enter {host.path('/var/lib/vastctl')}" in launched.stderr
    assert vast.creates == []


def _host_key(directory: Path) -> Path:
    key = directory / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.with_suffix(".pub")
