"""docs/deployment.md, tested as written.

The proxy configs the guide shows are the files in jobs/, word for word; nginx
(Debian 12's 1.22 in CI) and Caddy check them, and nginx runs one in front of
a real `vastctl serve` to show what it forwards. The guide's own commands run
in a sandbox: every /etc/vastctl and /var/lib/vastctl path is moved under a
temporary directory, `sudo` and file owners are dropped (there is no vastctl
user here), and each line the sandbox cannot run is named with the reason.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from helpers.deployment_sandbox import ENV_FILE, GUIDE, ROOT, Sandbox
from helpers.deployment_sandbox import blocks as _blocks
from helpers.deployment_sandbox import commands as _commands
from helpers.deployment_sandbox import sections as _sections

NGINX_CONF = ROOT / "jobs" / "nginx-vastctl.conf"
CADDYFILE = ROOT / "jobs" / "Caddyfile"
SERVE_UNIT = ROOT / "jobs" / "vastctl-serve.service"
ADMIN_TOKEN = "deployment-guide-admin-token-0123456789abcdef"
HOST = "manager.example.net"


# --- the guide's text: helpers/deployment_sandbox.py reads it and runs its lines in a sandbox ----------------


@pytest.fixture
def sandbox(tmp_path) -> Sandbox:
    return Sandbox(tmp_path / "host")


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


# --- the shipped files are what the guide shows ----------------------------------------------------------


@pytest.mark.parametrize("shipped,lang", [(NGINX_CONF, "nginx"), (CADDYFILE, "caddy"), (ENV_FILE, "sh")])
def test_the_guide_shows_each_shipped_file_word_for_word(shipped, lang):
    assert shipped.read_text() in _blocks(GUIDE.read_text(), lang), f"{shipped.name} differs from the guide's block"


def test_the_public_proxy_forwards_only_the_machines_api_and_healthz():
    """The README's promise, read off both configs: /v1/ and /healthz public, the rest behind an allow list."""
    nginx = NGINX_CONF.read_text()
    locations = dict(re.findall(r"^    location ([^{]+?) \{\n(.*?)^    \}", nginx, flags=re.M | re.S))
    assert set(locations) == {"/v1/", "= /healthz", "/"}
    assert "deny all;" in locations["/"] and "deny" not in locations["/v1/"] + locations["= /healthz"]
    assert not re.search(r"^\s*http2 on;", nginx, flags=re.M)  # nginx 1.25.1 and later only: Debian 12 has 1.22
    caddy = CADDYFILE.read_text()
    assert "@machines path /v1/* /healthz" in caddy and "@operators remote_ip" in caddy
    assert re.search(r"handle \{\s*respond 403\s*\}", caddy)
    assert re.search(r"timeouts \{[^}]*read_header[^}]*read_body", caddy)  # the README's Caddy advice


@pytest.mark.slow
def test_the_env_file_is_read_alike_by_systemd_and_sh(tmp_path):
    """systemd's EnvironmentFile= keeps a trailing `# …` in the value, sh drops it: only whole-line comments."""
    block = _blocks(_sections()["2"], "sh")[0]
    assert block == ENV_FILE.read_text()
    systemd = {}
    for line in block.splitlines():
        if not line or line.startswith("#"):
            continue
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=[^\s\"'#]*", line), f"not a plain KEY=value line: {line!r}"
        key, _, value = line.partition("=")
        systemd[key] = value
    env_file = tmp_path / "env"
    env_file.write_text(block)
    printed = subprocess.run(["sh", "-c", f"set -a; . {env_file}; env -0"], env={"PATH": os.environ["PATH"]},
                             capture_output=True, text=True, check=True).stdout
    by_sh = dict(item.split("=", 1) for item in printed.split("\0") if "=" in item)
    assert {key: by_sh.get(key) for key in systemd} == systemd
    assert systemd["VASTCTL_CONFIG"] == "/etc/vastctl/config.yaml"


# --- the guide's commands, in a sandbox -------------------------------------------------------------------


@pytest.mark.slow
def test_setting_up_makes_the_state_file_and_secret_readable_by_their_owner_only(sandbox):
    os.umask(umask := os.umask(0o022))  # the umask a login shell usually has; restored below
    try:
        sandbox.set_up()
    finally:
        os.umask(umask)
    assert _mode(sandbox.db) == 0o600 and _mode(sandbox.secret) == 0o600
    assert sqlite3.connect(sandbox.db).execute("SELECT count(*) FROM migrations").fetchone()[0] >= 1
    assert not (sandbox.home / ".local").exists()  # the env file pointed init at the manager's paths
    assert any("useradd" in line for line in sandbox.skipped)


def test_the_vastctl_users_home_gets_no_dotfiles_and_apt_no_mail_server():
    """useradd --create-home would copy /etc/skel (.bashrc, .profile) into /var/lib/vastctl, the state file's
    directory; cron's recommends would install exim4. The guide's own lines, as an operator copies them."""
    lines = _commands("1")
    (useradd,) = [line for line in lines if "useradd" in line]
    assert "--no-create-home" in useradd and "--create-home" not in useradd.replace("--no-create-home", "")
    assert any(re.match(r"sudo install -d -o vastctl -g vastctl -m 750 /var/lib/vastctl ", line) for line in lines)
    (apt,) = [line for line in lines if "apt-get install" in line]
    assert "--no-install-recommends" in apt and "ca-certificates" in apt.split()  # git recommends it, for https
    day_one = (ROOT / "docs" / "day-one.md").read_text()
    assert apt in day_one.replace("\n      ", " ")  # the checklist gives the same line


@pytest.mark.slow
def test_the_daily_backup_runs_as_written(sandbox):
    if shutil.which("sqlite3") is None:
        pytest.skip("the guide's backup uses the sqlite3 tool: apt-get install sqlite3 (.ci/run does)")
    sandbox.set_up()
    os.umask(umask := os.umask(0o022))  # the umask cron and a login shell usually have; restored below
    try:
        sandbox.run_section("5")
    finally:
        os.umask(umask)
    backups = sandbox.path("/var/lib/vastctl/backups")
    assert _mode(backups) == 0o700
    made = sorted(backups.glob("vastctl-*.db"))
    assert len(made) == 1  # the sqlite3 line and the Python line wrote the same day's file
    assert _mode(made[0]) == 0o600  # as the state file: every machine's row
    assert sqlite3.connect(made[0]).execute("SELECT name FROM migrations WHERE id = 1").fetchone() is not None


@pytest.mark.slow
def test_the_backup_before_an_upgrade_runs_on_its_own(sandbox):
    if shutil.which("sqlite3") is None:
        pytest.skip("the guide's backup uses the sqlite3 tool: apt-get install sqlite3 (.ci/run does)")
    sandbox.set_up()
    shutil.rmtree(sandbox.path("/var/lib/vastctl/backups"), ignore_errors=True)  # section 5 never set up
    os.umask(umask := os.umask(0o022))
    try:
        sandbox.run_section("6")
    finally:
        os.umask(umask)
    backup = sandbox.path("/var/lib/vastctl/backups/before-upgrade.db")
    assert _mode(backup) == 0o600
    assert sqlite3.connect(backup).execute("SELECT count(*) FROM migrations").fetchone()[0] >= 1
    assert any("git pull" in line for line in sandbox.skipped) and any("systemctl" in line for line in sandbox.skipped)


@pytest.mark.slow
def test_rolling_the_token_secret_runs_as_written(sandbox):
    sandbox.set_up()
    lines = [sandbox.runnable(line) for line in _commands("7")]
    assert None not in lines
    rotate, fleet, retire, backup = lines
    sandbox.sh(rotate)
    assert len(sandbox.secret.read_text().splitlines()) == 2 and _mode(sandbox.secret) == 0o600
    assert sandbox.sh(fleet).returncode == 0
    assert "retired 1 old secret" in sandbox.sh(retire).stderr
    assert len(sandbox.secret.read_text().splitlines()) == 1
    sandbox.sh(backup)
    copy = sandbox.path("/var/lib/vastctl/backups/vastctl.db.secret")
    assert copy.read_text() == sandbox.secret.read_text() and _mode(copy) == 0o600


@pytest.mark.slow
def test_a_command_without_the_config_says_how_to_find_the_state_file_and_makes_nothing(sandbox):
    """A bare `sudo -u vastctl vastctl …` finds the vastctl user's default paths, not the manager's files."""
    sandbox.set_up()
    before = sandbox.secret.read_text()
    result = sandbox.sh("vastctl token --rotate", check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: no token secret at ")
    assert "VASTCTL_CONFIG" in result.stderr and "no config file was read" in result.stderr
    assert f"beside the state file {sandbox.home}/.local/share/vastctl/vastctl.db" in result.stderr
    assert "`vastctl init` would make a new one" in result.stderr
    result = sandbox.sh("vastctl fleet", check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: no state file at ") and "VASTCTL_CONFIG" in result.stderr
    assert not (sandbox.home / ".local").exists() and sandbox.secret.read_text() == before


# --- nginx ------------------------------------------------------------------------------------------------


def _need(tool: str) -> str:
    found = shutil.which(tool) or (f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else None)
    if found is None:
        pytest.skip(f"{tool} is not installed: apt-get install {tool} (.ci/run installs it)")
    return found


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for the guide's host name, as certbot would leave one."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "fullchain.pem", directory / "privkey.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={HOST}",
                    "-addext", f"subjectAltName=DNS:{HOST}", "-keyout", str(key), "-out", str(cert)],
                   capture_output=True, check=True, timeout=60)
    return cert, key


def _nginx_prefix(tmp_path: Path, site: str) -> Path:
    """The guide's site file inside a minimal main config (conf.d files live in the http block), all paths in tmp."""
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    cert, key = _certificate(tmp_path / "letsencrypt" / "live" / HOST)
    site = site.replace(f"/etc/letsencrypt/live/{HOST}/fullchain.pem", str(cert))
    site = site.replace(f"/etc/letsencrypt/live/{HOST}/privkey.pem", str(key))
    _nginx_main(prefix, site)
    return prefix


def _nginx_main(prefix: Path, site: str) -> None:
    """nginx.conf in `prefix` holding the site file in its http block, every path inside `prefix`."""
    (prefix / "vastctl.conf").write_text(site)
    temporary = " ".join(f"{kind}_temp_path {prefix}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (prefix / "nginx.conf").write_text(
        f"daemon off;\npid {prefix}/nginx.pid;\nerror_log stderr;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    {temporary}\n    include {prefix}/vastctl.conf;\n}}\n")


def _nginx_test(nginx: str, prefix: Path) -> subprocess.CompletedProcess:
    return subprocess.run([nginx, "-t", "-p", str(prefix), "-e", "stderr", "-c", str(prefix / "nginx.conf")],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.slow
def test_the_shipped_nginx_config_passes_nginx_t(tmp_path):
    nginx = _need("nginx")
    result = _nginx_test(nginx, _nginx_prefix(tmp_path, NGINX_CONF.read_text()))
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


@pytest.mark.slow
def test_the_self_signed_certificate_for_trying_it_loads_the_site_unchanged(tmp_path):
    """Section 4's path without a public name: its openssl lines leave the files the shipped site names."""
    nginx = _need("nginx")
    trying = next(block for block in _blocks(_sections()["4"], "sh") if "openssl req" in block)
    live = tmp_path / "letsencrypt"
    for line in trying.replace("\\\n", " ").splitlines():
        if line.startswith("curl "):
            continue  # needs the site loaded: checked below with the same certificate
        line = re.sub(r"^sudo ", "", line).replace("/etc/letsencrypt", str(live))
        subprocess.run(["sh", "-c", line], capture_output=True, check=True, timeout=60)
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    _nginx_main(prefix, NGINX_CONF.read_text().replace("/etc/letsencrypt", str(live)))
    result = _nginx_test(nginx, prefix)
    assert result.returncode == 0, result.stderr
    cert = live / "live" / HOST / "fullchain.pem"
    names = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True, check=True).stdout
    assert f"DNS:{HOST}" in names
    assert "certbot certonly --nginx -d manager.example.net" in _sections()["4"]


@pytest.mark.slow
def test_nginx_t_would_catch_a_broken_config(tmp_path):
    """The check above can fail: the guide's former `http2 on;` is refused by nginx before 1.25.1."""
    nginx = _need("nginx")
    version = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=True).stderr
    site = NGINX_CONF.read_text().replace("listen 443 ssl http2;", "listen 443 ssl;\n    http2 on;")
    result = _nginx_test(nginx, _nginx_prefix(tmp_path, site.replace("deny all;", "deny everyone;")))
    assert result.returncode == 1, version
    assert "[emerg]" in result.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {log.read_text()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise AssertionError(f"nothing listens on {port}: {log.read_text()}")


def _serve(sandbox: Sandbox) -> tuple[subprocess.Popen, int]:
    """The serve unit's ExecStart, with the unit's environment file, on a free loopback port."""
    exec_start = re.search(r"^ExecStart=(.*)$", SERVE_UNIT.read_text(), flags=re.M).group(1)
    assert exec_start == "/usr/local/bin/vastctl serve --host 127.0.0.1 --port 8080"
    port = _free_port()
    command = exec_start.replace("/usr/local/bin/vastctl", "vastctl").replace("--port 8080", f"--port {port}")
    env_file = sandbox.path("/etc/vastctl/env")
    log = sandbox.root / "serve.log"
    proc = subprocess.Popen(["sh", "-c", f"set -a; . {env_file}; exec {command}"], env=sandbox.env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    _wait_for_port(port, proc, log)
    return proc, port


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Proxied:
    """An HTTPS client for nginx on loopback, checking its certificate (not its name: we dial 127.0.0.1)."""

    def __init__(self, port: int, cert: Path):
        self.port = port
        self.context = ssl.create_default_context(cafile=str(cert))
        self.context.check_hostname = False

    def request(self, method: str, path: str, body: str | None = None,
                headers: dict | None = None) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)
        try:
            conn.request(method, path, body=body, headers={"Host": HOST, **(headers or {})})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()


def _configure(sandbox: Sandbox) -> None:
    """The guide's section 1 edit of the config: an admin token (trusted_proxy is already 127.0.0.1)."""
    config = sandbox.path("/etc/vastctl/config.yaml")
    text = config.read_text()
    assert 'admin_token: ""' in text and re.search(r"^  trusted_proxy: 127\.0\.0\.1 ", text, flags=re.M)
    config.write_text(text.replace('admin_token: ""', f'admin_token: "{ADMIN_TOKEN}"'))


def _nginx_in_front(tmp_path: Path, sandbox: Sandbox, serve_port: int, *, allow: str | None = None):
    nginx = _need("nginx")
    https_port, http_port = _free_port(), _free_port()
    site = NGINX_CONF.read_text()
    assert site.count("listen 443 ssl http2;") == 1 and site.count("listen 80;") == 1
    site = site.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{https_port} ssl http2;")
    site = site.replace("listen 80;", f"listen 127.0.0.1:{http_port};")
    site = site.replace("http://127.0.0.1:8080;", f"http://127.0.0.1:{serve_port};")
    if allow is not None:
        site = site.replace("allow 192.0.2.0/24;", f"allow {allow};")
    prefix = _nginx_prefix(tmp_path, site)
    log = prefix / "nginx.log"
    proc = subprocess.Popen([nginx, "-p", str(prefix), "-e", "stderr", "-c", str(prefix / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    _wait_for_port(https_port, proc, log)
    _wait_for_port(http_port, proc, log)
    cert = tmp_path / "letsencrypt" / "live" / HOST / "fullchain.pem"
    return proc, Proxied(https_port, cert), http_port


@pytest.mark.slow
def test_nginx_forwards_the_machines_api_and_healthz_and_nothing_else(tmp_path, sandbox):
    sandbox.set_up()
    _configure(sandbox)
    serve, serve_port = _serve(sandbox)
    try:
        nginx, proxy, http_port = _nginx_in_front(tmp_path, sandbox, serve_port)
        try:
            status, _, body = proxy.request("GET", "/healthz")
            assert (status, json.loads(body)) == (200, {"ok": True})
            status, _, body = proxy.request("GET", "/v1/fleet", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert status == 200 and json.loads(body)["instances"] == []
            status, _, body = proxy.request("POST", "/v1/instances/not-a-machine/heartbeat", body="{}",
                                            headers={"Content-Type": "application/json"})
            assert status in (401, 404) and "nginx" not in body.decode()  # serve's own answer
            for method, path in [("GET", "/"), ("GET", "/metrics"), ("POST", "/login"), ("GET", "/static/dashboard.js"),
                                 ("GET", "/dashboard/live"), ("GET", "/v2/fleet"), ("GET", "/healthz/x")]:
                status, _, body = proxy.request(method, path, body="token=x" if method == "POST" else None,
                                                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert status == 403 and b"nginx" in body, (method, path, status)
            plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
            plain.request("GET", "/healthz", headers={"Host": HOST})
            response = plain.getresponse()
            assert response.status == 301 and response.getheader("Location") == f"https://{HOST}/healthz"
            plain.close()
        finally:
            _stop(nginx)
    finally:
        _stop(serve)
    served = (sandbox.root / "serve.log").read_text()
    assert '"GET /healthz" 200' in served and "/metrics" not in served and '"GET / ' not in served


@pytest.mark.slow
def test_an_allowed_operator_signs_in_through_nginx_with_a_secure_cookie(tmp_path, sandbox):
    """server.trusted_proxy (127.0.0.1 in the example config) makes nginx's X-Forwarded-Proto count."""
    sandbox.set_up()
    _configure(sandbox)
    serve, serve_port = _serve(sandbox)
    try:
        nginx, proxy, _ = _nginx_in_front(tmp_path, sandbox, serve_port, allow="127.0.0.1")
        try:
            status, _, body = proxy.request("GET", "/")
            assert status == 200 and b"sign in" in body.lower()
            status, headers, _ = proxy.request("POST", "/login", body=f"token={ADMIN_TOKEN}",
                                               headers={"Content-Type": "application/x-www-form-urlencoded"})
            assert status == 303
            cookie = headers["set-cookie"]
            assert cookie.startswith("__Host-") and "; Secure" in cookie and "HttpOnly" in cookie
        finally:
            _stop(nginx)
    finally:
        _stop(serve)


@pytest.mark.slow
def test_serve_itself_believes_x_forwarded_proto_from_the_trusted_proxy_only(sandbox):
    """The same through a bare socket, so it holds where nginx is missing: the header reaches the dashboard."""
    sandbox.set_up()
    _configure(sandbox)
    serve, serve_port = _serve(sandbox)

    def sign_in(proto: str) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", serve_port, timeout=30)
        try:
            conn.request("POST", "/login", body=f"token={ADMIN_TOKEN}", headers={
                "Host": HOST, "X-Forwarded-Proto": proto, "Content-Type": "application/x-www-form-urlencoded"})
            response = conn.getresponse()
            assert response.status == 303
            return response.getheader("Set-Cookie")
        finally:
            conn.close()

    try:
        assert "; Secure" in sign_in("https") and "; Secure" not in sign_in("http")
    finally:
        _stop(serve)
    config = sandbox.path("/etc/vastctl/config.yaml")
    config.write_text(re.sub(r"^  trusted_proxy: 127\.0\.0\.1", '  trusted_proxy: "10.9.9.9"', config.read_text(),
                             flags=re.M))
    serve, serve_port = _serve(sandbox)
    try:
        assert "; Secure" not in sign_in("https")  # from an address that is not the trusted proxy
    finally:
        _stop(serve)


# --- Caddy ------------------------------------------------------------------------------------------------


def _caddy_validate(caddy: str, caddyfile: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    home = tmp_path / "caddy-home"  # caddy keeps its data (certificates, locks) under $HOME / XDG dirs
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
           "XDG_CONFIG_HOME": str(home / "config")}
    return subprocess.run([caddy, "validate", "--config", str(caddyfile), "--adapter", "caddyfile"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_the_shipped_caddyfile_passes_caddy_validate(tmp_path):
    caddy = _need("caddy")
    result = _caddy_validate(caddy, CADDYFILE, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Valid configuration" in result.stdout + result.stderr


@pytest.mark.slow
def test_caddy_validate_would_catch_a_broken_caddyfile(tmp_path):
    caddy = _need("caddy")
    broken = tmp_path / "Caddyfile"
    broken.write_text(CADDYFILE.read_text().replace("read_body 10s", "read_bodies 10s"))
    result = _caddy_validate(caddy, broken, tmp_path)
    assert result.returncode != 0 and "read_bodies" in result.stdout + result.stderr


# --- the jobs, the example config and the guide name the same paths -----------------------------------


def _absolute_paths(text: str) -> set[str]:
    text = "\n".join(line for line in text.splitlines() if not line.startswith("PATH="))
    found = re.findall(r"(?<![\w.~$])(/(?:etc|var|usr|opt)/[\w./-]*\w)", text)
    return {path for path in found if not path.startswith("/var/lib/vastctl/backups/vastctl-")}


def test_every_path_in_jobs_and_the_example_config_is_in_the_deployment_guide():
    guide = (ROOT / "docs" / "deployment.md").read_text()
    # the manager host's files; jobs/onstart.sh runs on a rented machine, its paths are that machine's
    sources = [ROOT / "config.example.yaml", *sorted(p for p in (ROOT / "jobs").iterdir() if p.name != "onstart.sh")]
    paths = {path: source.name for source in sources for path in _absolute_paths(source.read_text())}
    assert {"/etc/vastctl/env", "/var/lib/vastctl/vastctl.db", "/usr/local/bin/vastctl"} <= set(paths)
    missing = {path: name for path, name in paths.items() if path not in guide}
    assert missing == {}


def test_the_log_format_is_the_same_in_cron_units_and_help(cli):
    cron = (ROOT / "jobs" / "crontab.example").read_text()
    unit = (ROOT / "jobs" / "vastctl-reconcile.service").read_text()
    help_text = cli("reconcile", "--help").out
    line = "vastctl reconcile >>/var/log/vastctl/reconcile.log 2>&1"
    assert line in cron and line in help_text
    assert "ExecStart=/usr/local/bin/vastctl reconcile\n" in unit and "one line per action" in help_text.lower()
    assert "One journal line per action" in unit
