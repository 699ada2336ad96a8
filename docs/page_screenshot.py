"""What docs/dashboard_screenshot.py's two settings share: a `vastctl serve` on loopback and the photographs of its page.

`serving` starts `vastctl serve --port 0` (on 127.0.0.1, the address it keeps unless told) in a process of its
own and stops it however the block ends; `photograph` signs in with Debian's chromium driven by Playwright (the
browser tests' setup: Playwright never downloads a browser of its own), writes a full-page screenshot at each
width and prints each page's height and whether anything on it scrolls sideways.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# what scrolls sideways: the page itself, or any box wider inside than it shows (a table in its .scroll)
SIDEWAYS = """[...document.querySelectorAll('*')].filter(e => e.scrollWidth > e.clientWidth + 1
    && (e === document.documentElement || ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
    && e.getClientRects().length).map(e => (e.id || e.className || e.tagName) + ' ' + e.scrollWidth + '>' + e.clientWidth)"""
# the variables that would point a vastctl at another file, server or account than the one set up here
FOREIGN_ENV = ("VASTCTL_DB", "VASTCTL_SERVER", "VASTCTL_TOKEN", "VASTCTL_ADMIN_TOKEN", "VAST_API_KEY", "ANTHROPIC_API_KEY")


def scrubbed_env(home: Path, config: Path) -> dict[str, str]:
    """This environment with HOME and VASTCTL_CONFIG in the scratch directory and nothing that points elsewhere."""
    env = {**os.environ, "HOME": str(home), "VASTCTL_CONFIG": str(config)}
    for name in FOREIGN_ENV:
        env.pop(name, None)
    return env


@contextlib.contextmanager
def serving(env: dict[str, str], log: Path, *args: str) -> Iterator[str]:
    """`vastctl serve --port 0 ARGS…` in its own process; yields its URL, stops it (SIGTERM, then SIGKILL) at the end."""
    serve = subprocess.Popen([sys.executable, "-m", "vastctl", "serve", "--port", "0", *args],
                             env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        yield _wait_for_url(log, serve)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=20)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait(timeout=10)


def photograph(url: str, token: str, shots: Sequence[tuple[int, Path]], what: str) -> None:
    """Sign in at `url` and write a full-page screenshot at each (width, file); print what each shows."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            for width, out in shots:
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(url + "/")
                page.fill('input[name="token"]', token)
                page.click('#signin-form button[type="submit"]')
                page.wait_for_selector("#chart svg polyline >> visible=true")
                page.screenshot(path=str(out), full_page=True)
                height = page.evaluate("document.documentElement.scrollHeight")
                wide = page.evaluate(SIDEWAYS)
                print(f"{out}: {what}, {width} px wide, {height} px tall,"
                      f" {'scrolls sideways: ' + ', '.join(wide) if wide else 'nothing scrolls sideways'}")
                page.close()
        finally:
            browser.close()


def _wait_for_url(log: Path, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+)", log.read_text())
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"serve exited {proc.returncode}: {log.read_text()}")
        time.sleep(0.05)
    raise SystemExit(f"serve did not start: {log.read_text()}")
