"""Real parts on loopback for the tunnel tests: Debian's sshd on the shipped tunnel config, Debian's nginx on the
shipped gRPC balancer config, and a gRPC health server standing in for a machine's cuzk daemon.

sshd needs root (it switches to the account it authenticates) and a real account for the tunnel user: the
tests create `vastctl-tunnel-test` (no home, no shell, no password, not locked) when it is missing and leave it
(other runs on the host may be using it). The shipped config reads the keys file as `nobody`; the test's file
lives under pytest's root-only temporary directory, so here the reading account is root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import threading
from concurrent import futures
from pathlib import Path

import pytest

from helpers.serving import free_port, stop_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
SSHD_CONF = ROOT / "jobs" / "sshd-vastctl-tunnel.conf"
NGINX_CONF = ROOT / "jobs" / "nginx-cuzk-grpc.conf"
TUNNEL_USER = "vastctl-tunnel-test"


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def need_root_sshd() -> str:
    if os.geteuid() != 0:
        pytest.skip("sshd authenticates another account only as root (CI runs as root)")
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("Debian's openssh-server is not installed (.ci/run installs it)")
    return "/usr/sbin/sshd"


def tunnel_account() -> str:
    """The tunnel account: created when missing, with no home, no shell and a password nobody can use ('*',
    which sshd does not take for a locked account)."""
    try:
        pwd.getpwnam(TUNNEL_USER)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                               "--password", "*", TUNNEL_USER], capture_output=True, text=True, check=False)
        if done.returncode not in (0, 9):  # 9: made meanwhile by a parallel run
            pytest.skip(f"cannot create the tunnel account: {done.stderr.strip()}")
    return TUNNEL_USER


class Sshd:
    """sshd -D on 127.0.0.1 with its own host key, pid file and config: the shipped Match block for the account."""

    def __init__(self, home: Path, authorized_keys: Path, *, shipped: str | None = None, reader: str = "root"):
        """`shipped`: the tunnel account's config as installed (default: jobs/'s, keys at `authorized_keys`);
        `reader`: the account sshd reads the keys as (the guides' in-order test keeps the shipped `nobody`)."""
        self.binary = need_root_sshd()
        self.user = tunnel_account()
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.authorized_keys = authorized_keys
        self.host_key = home / "ssh_host_ed25519_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.host_key)], check=True)
        self.port = free_port()
        self.log = home / "sshd.log"
        replaced = [("Match User vastctl-tunnel", f"Match User {self.user}"),
                    ("AuthorizedKeysCommandUser nobody", f"AuthorizedKeysCommandUser {reader}")]
        if shipped is None:
            shipped = SSHD_CONF.read_text()
            replaced.append(("/var/lib/vastctl-tunnel/authorized_keys", str(authorized_keys)))
        for old, new in replaced:
            assert shipped.count(old) == 1, old
            shipped = shipped.replace(old, new)
        self.config = home / "sshd_config"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\nPidFile {home}/sshd.pid\n"
            f"UsePAM no\nAllowUsers {self.user}\nLogLevel VERBOSE\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\n{shipped}")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege-separation directory
        checked = subprocess.run([self.binary, "-t", "-f", str(self.config)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        self.proc = subprocess.Popen([self.binary, "-D", "-e", "-f", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=self.log.open("w"))
        wait_for(lambda: listening(self.port), "sshd listens", proc=self.proc, log=self.log)
        kind, body = self.host_public_key.read_text().split()[:2]
        self.known_hosts = home / "known_hosts"  # as the boot script writes it from VASTCTL_TUNNEL_HOST_KEY
        self.known_hosts.write_text(f"vastctl-manager {kind} {body}\n")

    @property
    def host_public_key(self) -> Path:
        return self.host_key.with_suffix(".pub")

    def ssh(self, key: Path, *options: str, command: str | None = None,
            timeout: float = 20) -> subprocess.CompletedProcess:
        """The OpenSSH client as the boot script runs it: the manager's host key pinned, batch mode, this key only."""
        known = self.known_hosts
        argv = ["ssh", "-i", str(key), "-p", str(self.port), "-F", "/dev/null", "-o", "BatchMode=yes",
                "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
                "-o", "HostKeyAlias=vastctl-manager", "-o", "ExitOnForwardFailure=yes", "-o", "ConnectTimeout=10",
                *options, f"{self.user}@127.0.0.1", *([command] if command else [])]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              check=False)

    def stop(self) -> None:
        stop_process(self.proc)


class Nginx:
    """nginx in the foreground on the shipped gRPC balancer config, listening on a free loopback port."""

    def __init__(self, home: Path, upstream_file: Path, *, site: str | None = None):
        """`site`: the balancer's config as installed (default: jobs/nginx-cuzk-grpc.conf)."""
        self.binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(self.binary).exists():
            pytest.skip("Debian's nginx is not installed (.ci/run installs it)")
        self.prefix = home
        home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        site = NGINX_CONF.read_text() if site is None else site
        for old, new in (("include /etc/nginx/vastctl/cuzk-upstream.conf;", f"include {upstream_file};"),
                         ("listen 127.0.0.1:9830 http2;", f"listen 127.0.0.1:{self.port} http2;")):
            assert site.count(old) == 1, old
            site = site.replace(old, new)
        (home / "cuzk-grpc.conf").write_text(site)
        temporary = " ".join(f"{kind}_temp_path {home}/{kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                                "uwsgi", "scgi"))
        self.conf = home / "nginx.conf"
        self.conf.write_text(
            f"daemon off;\npid {home}/nginx.pid;\nerror_log {home}/error.log;\nworker_processes 1;\nevents {{}}\n"
            f"http {{\n    access_log off;\n    {temporary}\n    include {home}/cuzk-grpc.conf;\n}}\n")
        self.log = home / "error.log"
        self.proc: subprocess.Popen | None = None

    def command(self, *args: str) -> list[str]:
        return [self.binary, "-p", str(self.prefix), "-e", str(self.log), "-c", str(self.conf), *args]

    @property
    def reload_command(self) -> str:
        return " ".join(self.command("-s", "reload"))

    def start(self) -> Nginx:
        checked = subprocess.run(self.command("-t"), capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: listening(self.port), "nginx listens", proc=self.proc, log=self.log)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


class FakeDaemon:
    """A gRPC server with the standard health service on 127.0.0.1, counting the calls it answered: it stands in
    for one machine's cuzk (the balancer and the tunnels see a gRPC server; which one answered is the count)."""

    def __init__(self, name: str):
        import grpc
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc

        self.name = name
        self.calls = 0
        self._lock = threading.Lock()
        daemon = self

        class Counting(grpc.ServerInterceptor):
            def intercept_service(self, continuation, handler_call_details):
                with daemon._lock:
                    daemon.calls += 1
                return continuation(handler_call_details)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[Counting()])
        servicer = health.HealthServicer()
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None)


def health_check(port: int, timeout: float = 5) -> str:
    """One gRPC call (grpc.health.v1.Health/Check) to 127.0.0.1:port, as Curio's cuzk client would make its calls."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
