"""docs/deployment.md's commands run in a sandbox: every /etc/vastctl and /var/lib/vastctl path moved under one
directory, `sudo` and file owners dropped, and each line the sandbox cannot run recorded with the reason."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deployment.md"
ENV_FILE = ROOT / "jobs" / "vastctl.env"


# Lines of the guide's sections 1, 2, 5, 6 and 7 the sandbox does not run, and why. A new command in
# those sections must either run here or be added to this table.
NOT_IN_A_SANDBOX = {
    "apt-get install": "installs packages",
    "useradd": "creates a system user",
    "python3 -m venv /opt/vastctl": "installs into /opt (the tests run the installed vastctl)",
    "/opt/vastctl/bin/pip": "installs into /opt",
    "ln -sf /opt/vastctl/bin/vastctl": "links into /usr/local/bin",
    "install -m 755 jobs/curio-demand.sh": "installs into /usr/local/bin",
    "sudoedit": "an editor",
    "cd vastctl && git pull": "fetches a newer vastctl",
    "systemctl": "needs systemd as init",
}


def sections() -> dict[str, str]:
    """Section number ("1".."7") → its text."""
    parts = re.split(r"^## (\d+)\. .*$", GUIDE.read_text(), flags=re.M)
    return {number: text for number, text in zip(parts[1::2], parts[2::2])}


def blocks(text: str, lang: str | None = None) -> list[str]:
    return [body for fence, body in re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S)
            if lang is None or fence == lang]


def commands(section: str) -> list[str]:
    """The logical shell lines of a section's ```sh blocks (continuations joined), shipped files left out."""
    shipped = {ENV_FILE.read_text()}
    lines = []
    for block in blocks(sections()[section], "sh"):
        if block in shipped:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append(line.strip())
    return lines


class Sandbox:
    """The manager's paths under one directory, and the guide's lines run against them."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home" / "vastctl"  # what a bare `sudo -u vastctl` would find as HOME
        self.home.mkdir(parents=True)
        bin_dir = str(Path(sys.executable).parent)  # the vastctl under test, as /usr/local/bin/vastctl
        self.env = {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"}
        self.skipped: list[str] = []

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def moved(self, text: str) -> str:
        for prefix in ("/etc/vastctl", "/var/lib/vastctl", "/var/log/vastctl"):
            text = text.replace(prefix, str(self.root) + prefix)
        return text

    def runnable(self, line: str) -> str | None:
        """The line as the sandbox runs it, or None (recorded in `skipped`) when it cannot."""
        for needle, why in NOT_IN_A_SANDBOX.items():
            if needle in line:
                self.skipped.append(f"{line}  ({why})")
                return None
        line = re.sub(r"^sudo -u vastctl ", "", line)
        line = re.sub(r"^sudo ", "", line)
        line = re.sub(r" -[og] \S+", "", line) if line.startswith("install ") else line
        assert "sudo" not in line, line
        return self.moved(line)

    def sh(self, line: str, *, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(["sh", "-c", line], cwd=ROOT, env=self.env, capture_output=True, text=True,
                                timeout=120, check=False)
        if check:
            assert result.returncode == 0, f"{line}\nexit {result.returncode}\n{result.stdout}{result.stderr}"
        return result

    def run_section(self, section: str) -> list[subprocess.CompletedProcess]:
        results = []
        for line in commands(section):
            runnable = self.runnable(line)
            if runnable is not None:
                results.append(self.sh(runnable))
                if "/etc/vastctl/" in line and "install" in line:
                    self.move_paths_inside(Path(runnable.split()[-1]))
        return results

    def move_paths_inside(self, installed: Path) -> None:
        """The installed config and env file name the manager's paths: point them into the sandbox too."""
        installed.write_text(self.moved(installed.read_text()))

    def set_up(self) -> None:
        """Sections 1 and 2, as far as a sandbox goes: directories, config, env file, `vastctl init`."""
        self.run_section("1")
        self.run_section("2")

    @property
    def db(self) -> Path:
        return self.path("/var/lib/vastctl/vastctl.db")

    @property
    def secret(self) -> Path:
        return self.path("/var/lib/vastctl/vastctl.db.secret")
