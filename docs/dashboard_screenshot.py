"""docs/dashboard.png and docs/dashboard-phone.png: the dashboard of a real simulated fleet, on a laptop and a phone.

Runs `vastctl demo --keep` (seed 11, the day of the committed screenshots), serves the
kept state file with `vastctl serve --as-of` at the end of the simulated day,
signs in with Debian's chromium driven by Playwright
(the browser tests' setup; Playwright never downloads a browser of its own),
and writes a full-page screenshot at 1280 px and at 390 px (a phone), printing
each page's height and whether it scrolls sideways.

Rerun from the repository root (apt-get install chromium; pip install -e '.[test]'):
    python docs/dashboard_screenshot.py
    python docs/dashboard_screenshot.py --kept day.db --as-of 2031-03-04T00:00:00Z   # a day kept before
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
END_OF_DAY = re.compile(r"--as-of (\S+)`")
DOCS = Path(__file__).resolve().parent
# what scrolls sideways: the page itself, or any box wider inside than it shows (a table in its .scroll)
SIDEWAYS = """[...document.querySelectorAll('*')].filter(e => e.scrollWidth > e.clientWidth + 1
    && (e === document.documentElement || ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
    && e.getClientRects().length).map(e => (e.id || e.className || e.tagName) + ' ' + e.scrollWidth + '>' + e.clientWidth)"""
SHOTS = ((1280, DOCS / "dashboard.png"), (390, DOCS / "dashboard-phone.png"))


def vastctl(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vastctl", *args], env=env, capture_output=True, text=True,
                          timeout=600, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=11)  # the screenshots' day (demo/setting.DEFAULT_SEED is now 351)
    parser.add_argument("--kept", type=Path, help="a state file `demo --keep` left (its FILE.secret beside it)")
    parser.add_argument("--as-of", help="with --kept: the end of its day, as the demo printed it")
    parser.add_argument("--out-dir", type=Path, default=DOCS)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="vastctl-screenshot-") as scratch:
        home = Path(scratch)
        token = secrets.token_urlsafe(24)
        config = home / "config.yaml"
        config.write_text(f'db: "{home / "day.db"}"\nserver:\n  admin_token: "{token}"\n')
        env = {**os.environ, "HOME": str(home), "VASTCTL_CONFIG": str(config)}
        for name in ("VASTCTL_DB", "VASTCTL_SERVER", "VASTCTL_TOKEN", "VAST_API_KEY", "ANTHROPIC_API_KEY"):
            env.pop(name, None)
        if args.kept:
            shutil.copyfile(args.kept, home / "day.db")
            shutil.copyfile(f"{args.kept}.secret", home / "day.db.secret")
            as_of = args.as_of
        else:
            kept = vastctl("demo", "--seed", str(args.seed), "--keep", str(home / "day.db"), env=env)
            as_of = END_OF_DAY.search(kept.stderr + kept.stdout).group(1)
        log = home / "serve.log"
        serve = subprocess.Popen([sys.executable, "-m", "vastctl", "serve", "--port", "0", "--as-of", as_of],
                                 env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
        try:
            url = _wait_for_url(log, serve)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
                for width, name in SHOTS:
                    page = browser.new_page(viewport={"width": width, "height": 900})
                    page.goto(url + "/")
                    page.fill('input[name="token"]', token)
                    page.click('#signin-form button[type="submit"]')
                    page.wait_for_selector("#chart svg polyline >> visible=true")
                    out = args.out_dir / name.name
                    page.screenshot(path=str(out), full_page=True)
                    height = page.evaluate("document.documentElement.scrollHeight")
                    wide = page.evaluate(SIDEWAYS)
                    day = f"{args.kept}" if args.kept else f"seed {args.seed}'s day"
                    print(f"{out}: {day} at {as_of}, {width} px wide, {height} px tall,"
                          f" {'scrolls sideways: ' + ', '.join(wide) if wide else 'nothing scrolls sideways'}")
                    page.close()
                browser.close()
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=20)


def _wait_for_url(log: Path, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+)", log.read_text())
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"serve exited {proc.returncode}: {log.read_text()}")
        time.sleep(0.05)
    raise SystemExit(f"serve did not start: {log.read_text()}")


if __name__ == "__main__":
    main()
