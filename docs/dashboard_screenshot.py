"""docs/dashboard.png, docs/dashboard-phone.png, docs/playground.png and docs/playground-phone.png: the dashboard.

The first two: a real simulated fleet's day at its end. Runs `vastctl demo --keep` (seed 11, the day of the
committed screenshots) and serves the kept state file with `vastctl serve --as-of` at the end of the simulated
day (the page says so: a past moment, not live).

The other two (--playground): a live manager of docs/demo.md's playground, `provider: sim` with launch.join ssh,
its machines launched by `vastctl agent-step` for the demand reported, booted and joined, served by `vastctl
serve` as it is now (docs/playground_screenshot.py).

Each signs in with Debian's chromium driven by Playwright (docs/page_screenshot.py) and writes a full-page
screenshot at 1280 px and at 390 px (a phone), printing each page's height and whether it scrolls sideways.
Whatever it starts (serve, the stand-in daemons' process, its scratch directory) is gone when it ends.

Rerun from the repository root (apt-get install chromium; pip install -e '.[test]'):
    python docs/dashboard_screenshot.py                 # the kept day (about 20 s)
    python docs/dashboard_screenshot.py --playground    # the live playground (about a minute)
    python docs/dashboard_screenshot.py --all           # all four
    python docs/dashboard_screenshot.py --kept day.db --as-of 2031-03-04T00:00:00Z   # a day kept before
"""

from __future__ import annotations

import argparse
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from page_screenshot import photograph, scrubbed_env, serving

END_OF_DAY = re.compile(r"--as-of (\S+)`")
DOCS = Path(__file__).resolve().parent
WIDTHS = (1280, 390)
DAY_SHOTS = ("dashboard.png", "dashboard-phone.png")
PLAYGROUND_SHOTS = ("playground.png", "playground-phone.png")


def vastctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vastctl", *args], env=env, capture_output=True, text=True,
                          timeout=600, check=True)


def kept_day(args: argparse.Namespace) -> None:
    """The demo's day (or one kept before) at its end, served with --as-of."""
    with tempfile.TemporaryDirectory(prefix="vastctl-screenshot-") as scratch:
        home = Path(scratch)
        token = secrets.token_urlsafe(24)
        config = home / "config.yaml"
        config.write_text(f'db: "{home / "day.db"}"\nserver:\n  admin_token: "{token}"\n')
        env = scrubbed_env(home, config)
        if args.kept:
            shutil.copyfile(args.kept, home / "day.db")
            shutil.copyfile(f"{args.kept}.secret", home / "day.db.secret")
            as_of = args.as_of
        else:
            kept = vastctl("demo", "--seed", str(args.seed), "--keep", str(home / "day.db"), env=env)
            end = END_OF_DAY.search(kept.stderr + kept.stdout)
            if end is None:
                raise SystemExit(f"the demo did not print the end of its day:\n{kept.stderr}{kept.stdout}")
            as_of = end.group(1)
        day = f"{args.kept}" if args.kept else f"seed {args.seed}'s day"
        with serving(env, home / "serve.log", "--as-of", as_of) as url:
            photograph(url, token, _shots(args.out_dir, DAY_SHOTS), f"{day} at {as_of}")


def playground(args: argparse.Namespace) -> None:
    """The playground's manager, live: its machines joined, served on the wall clock."""
    import playground_screenshot

    with tempfile.TemporaryDirectory(prefix="vastctl-playground-") as scratch:
        home = Path(scratch)
        token = secrets.token_urlsafe(24)
        config = playground_screenshot.write_config(home, token)
        env = scrubbed_env(home, config)
        with playground_screenshot.live_manager(config, env), serving(env, home / "serve.log") as url:
            photograph(url, token, _shots(args.out_dir, PLAYGROUND_SHOTS), "the playground, live")


def _shots(out_dir: Path, names: tuple[str, str]) -> list[tuple[int, Path]]:
    return [(width, out_dir / name) for width, name in zip(WIDTHS, names)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=11)  # the screenshots' day (demo/setting.DEFAULT_SEED is now 351)
    parser.add_argument("--kept", type=Path, help="a state file `demo --keep` left (its FILE.secret beside it)")
    parser.add_argument("--as-of", help="with --kept: the end of its day, as the demo printed it")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--playground", action="store_true", help="only the live playground's two screenshots")
    which.add_argument("--all", action="store_true", help="the kept day's two and the playground's two")
    parser.add_argument("--out-dir", type=Path, default=DOCS)
    args = parser.parse_args()
    if not args.playground:
        kept_day(args)
    if args.playground or args.all:
        playground(args)


if __name__ == "__main__":
    main()
