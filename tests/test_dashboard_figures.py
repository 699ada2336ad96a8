"""The dashboard's figures are the CLI's for the same state file and --as-of: `vastctl cost` (whole file, --since
24h), `fleet` and the demo's own account of its day; and a file looked at --as-of stays at that moment."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from helpers.dashboard import ADMIN, Browser

from vastctl import clock
from vastctl import config as config_module
from vastctl.serving import server
from vastctl.state import tokens

END = "2031-03-03T03:00:00Z"  # the end of a 3-hour demo day (demo.end_of)


def figure(page: str, ident: str) -> str:
    return re.search(rf'id="{ident}">([^<]+)<', page).group(1)


def kept_page(kept, moment) -> str:
    config = config_module.from_mapping({"server": {"admin_token": ADMIN}})
    config.db = str(kept)
    app = server.App(config, tokens.Keyring(config.secret_path), clock=clock.StillClock(clock.SYSTEM, moment))
    browser = Browser(app)
    browser.sign_in()
    return browser.get("/").text


@pytest.mark.slow  # a simulated day
def test_the_pages_figures_are_the_clis_and_the_demos_for_the_same_file_and_as_of(cli, tmp_path):
    kept = tmp_path / "day.db"
    run = cli("demo", "--hours", "3", "--keep", kept, "--json")
    assert run.code == 0, run.err
    demo = json.loads(run.out)
    whole = json.loads(cli("--db", kept, "--as-of", END, "cost", "--json").out)
    day = json.loads(cli("--db", kept, "--as-of", END, "cost", "--since", "24h", "--json").out)
    summary = json.loads(cli("--db", kept, "--as-of", END, "fleet", "--json").out)["summary"]
    page = kept_page(kept, clock.parse_iso(END))

    assert figure(page, "cost-total") == f"${whole['cost']:.2f}" == f"${demo['vastctl_cost']:.2f}"
    assert figure(page, "cost-per-1000") == f"${whole['cost_per_1000_proofs']:.2f}"
    assert f"· {whole['proofs']} proofs ·" in page and whole["proofs"] == demo["vastctl_proofs"] > 0
    assert demo["vastctl_as_of"] == whole["as_of"] == END
    assert figure(page, "cost-day") == f"${day['cost']:.2f}" and figure(page, "proofs-day") == str(day["proofs"])
    assert figure(page, "spend-now") == f"${summary['spend_per_hour']:.2f}"
    capacity = summary["capacity_proofs_per_hour"]
    assert figure(page, "capacity") == (f"{capacity:.1f}".rstrip("0").rstrip(".") if capacity % 1 else f"{capacity:g}")
    assert figure(page, "target") == f"{summary['target_proofs_per_hour']:g}"
    # the demo's own printout names the same account beside the simulator's billing
    table = cli("demo", "--hours", "3").out
    assert f"vastctl's account: cost / proofs reported    ${demo['vastctl_cost']:,.2f} / {demo['vastctl_proofs']}" in table
    # a day looked at later, or twice, shows the same figures: nothing runs on past --as-of
    again = kept_page(kept, clock.parse_iso(END))
    assert figure(again, "cost-total") == figure(page, "cost-total")
    later = json.loads(cli("--db", kept, "--as-of", "2031-03-03T04:00:00Z", "cost", "--json").out)
    assert later["cost"] > whole["cost"]  # an hour later the machines left running billed on: --as-of is a moment


def test_a_still_clock_stands_at_its_moment_while_real_time_runs():
    real = clock.VirtualClock(clock.parse_iso(END))
    still = clock.StillClock(real, clock.parse_iso(END))
    real.advance(3600)
    still.sleep(60)  # its sleeps are real ones
    assert still.now() == clock.parse_iso(END) and real.now() == clock.parse_iso(END) + timedelta(seconds=3660)
    assert still.monotonic() == real.monotonic() == 3660


def test_as_of_that_is_not_a_time_is_one_error_line(cli):
    for command in (("cost",), ("fleet",)):
        result = cli("--as-of", "yesterday", *command)
        assert result.code == 2 and result.err.count("\n") == 1
        assert result.err.startswith("error: --as-of must be a UTC time like 2031-03-04T00:00:00Z")
