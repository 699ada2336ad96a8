"""The boot harness: a real `vastctl serve` with the bench gate, and one launched machine running its boot script
under bash in a sandbox against the fakes of curio, cuzk and cuzk-bench (tests/fakes/), with the fake vast
(helpers/fake_vast.py) behind the launch."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from helpers.fake_vast import KEY, FakeVast
from helpers.serving import ADMIN_TOKEN, Manager, free_port, free_port_block, run_vastctl

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"
VENV_BIN = Path(sys.executable).parent
# The fake daemon proves in 0.05 s (good) or 0.5 s (slow), one proof at a time, which the fake bench reads 1000
# times slower: 72 proofs/h (good) or 7.2 (slow), real machines' rates. The gate sits between them by the same
# factor (~3.2 each way), so a loaded machine's slower bench (33/h once, under a load of 6) still passes.
GATE = 22  # proofs/hour
TIME_SCALE = "1000"


def start_manager(tmp_path, launch: str = "") -> Manager:
    """serve with the gate, short boot-script intervals and the bench the script runs; `launch` adds launch keys."""
    m = Manager(tmp_path / "manager")
    launch_env = {"VASTCTL_HEARTBEAT_S": "0.3", "VASTCTL_CUZK_WAIT_S": "60", "VASTCTL_RETRY_FOR": "10s"}
    for attempt in range(5):  # its URL names its port before it listens: a port another test took meanwhile
        port = free_port_block(1)  # below the ephemeral range, so no test's outgoing connection holds it
        m.config_path.write_text(
            f"server:\n  url: http://127.0.0.1:{port}\n  admin_token: {ADMIN_TOKEN}\n"
            f"fleet:\n  min_bench_rate: {GATE}\n  max_dph: 1.0\n"
            "launch:\n  vastctl_source: vastctl==0.1.0\n  install: 'true'\n  bench_count: 4\n  bench_concurrency: 2\n"
            f"  env: {json.dumps(launch_env)}\n{launch}")
        try:
            return m.start(port)
        except AssertionError as exc:
            if "already in use" not in str(exc) or attempt == 4:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def manager(tmp_path):
    m = start_manager(tmp_path)
    yield m
    m.stop()


class Machine:
    """The launched machine: its create request, its sandbox, and its boot script running under bash."""

    def __init__(self, manager: Manager, vast: FakeVast, home: Path):
        self.manager, self.vast, self.home = manager, vast, home
        self.operator = {**manager.env, "VAST_API_KEY": KEY, "VAST_API_URL": vast.url}
        launched = run_vastctl("launch", "--gpu", "RTX 4090", "--json", env=self.operator)
        assert launched.returncode == 0, launched.stderr
        (self.row,) = json.loads(launched.stdout)["launched"]
        (self.create,) = vast.creates
        self.uuid, self.label = self.row["uuid"], self.row["label"]
        self.make_sandbox(home)
        self.grpc, self.status = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def make_sandbox(self, home: Path) -> None:
        """The machine's disk at `home`, reached through a short link: a Unix socket's path must fit in 107
        bytes, and the ones the daemon (…/root/run/curio/cuzk.sock) and ssh (…/data/zk/tunnel.ctl) make would
        not under a long tmp_path."""
        home.mkdir(parents=True)
        self._link_dir = Path(tempfile.mkdtemp(prefix="vm-"))
        self.home = self._link_dir / "m"
        self.home.symlink_to(home, target_is_directory=True)
        self.zk = self.home / "data" / "zk"
        self.log = self.home / "onstart.log"

    def script(self) -> str:
        """The script as vast runs it: the create's onstart, unpacked if it was packed to fit vast's limit, or
        fetched from the manager as its loader does (with the machine's token, checked against the pinned sha256)."""
        sent = self.create["onstart"]
        packed = re.search(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d \| gunzip", sent)
        if packed:
            return gzip.decompress(base64.b64decode(packed.group(1))).decode()
        pinned = re.search(r'echo "([0-9a-f]{64})  \$f.part" \| sha256sum -c', sent)
        if not pinned:
            return sent
        answer = requests.get(f"{self.manager.url}/v1/instances/{self.uuid}/onstart", timeout=10,
                              headers={"Authorization": f"Bearer {self.create['env']['VASTCTL_TOKEN']}"})
        assert answer.status_code == 200 and hashlib.sha256(answer.content).hexdigest() == pinned.group(1)
        return answer.text

    def boot(self, **knobs: str) -> Machine:
        path = self.home / "onstart.sh"
        path.write_text(self.script())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VASTCTL_", "VAST_"))}
        env.update(self.create["env"])
        env.update(PATH=f"{FAKES}:{VENV_BIN}:/usr/bin:/bin", HOME=str(self.home), CONTAINER_ID="5001",
                   VASTCTL_LOG=str(self.log), VASTCTL_ZK_DIR=str(self.zk), FAKE_BENCH_TIME_SCALE=TIME_SCALE,
                   FAKES_ROOT=str(self.home / "root"),
                   VASTCTL_CUZK_LISTEN=f"127.0.0.1:{self.grpc}", VASTCTL_CUZK_STATUS_LISTEN=f"127.0.0.1:{self.status}",
                   **knobs)
        self.zk.mkdir(parents=True, exist_ok=True)
        (self.zk / "c1.json").write_text('{"SectorNum": 1, "Phase1Out": "ZmFrZQ=="}')  # the bench input, fetched once
        self.proc = subprocess.Popen(["bash", str(path)], env=env, cwd=self.home, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def wait_exit(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the boot script did not finish:\n{self.text('onstart.log')}") from None

    def stop(self) -> None:
        """The whole sandbox process group (script, daemon, bench) if anything is left."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        kill_naming(str(self._link_dir))  # `ssh -f` daemonizes into a session of its own: killpg misses it
        shutil.rmtree(self._link_dir, ignore_errors=True)  # the link only: the sandbox stays in tmp_path

    def current(self) -> dict:
        return self.manager.rows()[self.uuid]

    def wait_for(self, predicate, what: str, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self.current()
            if predicate(row):
                return row
            if self.proc.poll() is not None and not predicate(self.current()):
                break
            time.sleep(0.1)
        raise AssertionError(f"{what}: row {self.current()}\n{self.text('onstart.log')}\n{self.text('zk/cuzk.log')}")

    def text(self, name: str) -> str:
        path = self.home / name
        return path.read_text(errors="replace") if path.exists() else f"({name} missing)"

    def daemon_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.status), timeout=1):
                return True
        except OSError:
            return False


def kill_naming(path: str) -> None:
    """SIGKILL every process whose command line names `path` (this machine's sandbox): what left its group."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(path.encode() in arg for arg in args):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
