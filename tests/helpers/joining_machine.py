"""One more machine launched into a running fleet: the boot harness's Machine (helpers/boot.py) takes the only
create, this one the newest, and joins the fleet through the tunnel to a stand-in daemon."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers.boot import Machine
from helpers.fake_vast import KEY, FakeVast
from helpers.serving import Manager, free_port, run_vastctl
from helpers.tunnel_parts import FakeDaemon


class JoiningMachine(Machine):
    """One more launched machine (the harness's Machine takes the only create; this takes the newest one)."""

    def __init__(self, manager: Manager, vast: FakeVast, home: Path, daemon: FakeDaemon):
        self.manager, self.vast, self.home, self.daemon = manager, vast, home, daemon
        self.operator = {**manager.env, "VAST_API_KEY": KEY, "VAST_API_URL": vast.url}
        launched = run_vastctl("launch", "--gpu", "RTX 4090", "--json", env=self.operator)
        assert launched.returncode == 0, launched.stderr
        self.outputs = [launched.stdout, launched.stderr]
        (self.row,) = json.loads(launched.stdout)["launched"]
        self.create = next(c for c in vast.creates if c["label"] == self.row["label"])
        self.uuid, self.label = self.row["uuid"], self.row["label"]
        self.make_sandbox(home)
        self.grpc, self.status = free_port(), free_port()
        self.proc = None

    def stop(self) -> None:
        """The sandbox, and the tunnel's ssh master, which `ssh -f` took out of the sandbox's process group."""
        super().stop()
        control = self.zk / "tunnel.ctl"
        if control.exists():
            subprocess.run(["ssh", "-S", str(control), "-O", "exit", "vastctl-manager"], capture_output=True,
                           timeout=10, check=False)

    def join(self) -> JoiningMachine:
        # the tunnel leads to the gRPC stand-in; the fake cuzk keeps serving the bench on its own port
        return self.boot(VASTCTL_TUNNEL_TARGET=self.daemon.address, VASTCTL_TUNNEL_WAIT_S="30")
