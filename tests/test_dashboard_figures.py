"""The dashboard's figures are the CLI's for the same state file and --as-of: `vastctl cost` (whole file, --since
24h), `fleet` and the demo's own account of its day; and a file looked at --as-of stays at that moment."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from helpers.dashboard import ADMIN, Browser
from helpers.prometheus_samples import samples

from vastctl import clock
from vastctl import config as config_module
from vastctl.serving import server
from vastctl.state import tokens

END = "2031-03-03T03:00:00Z"  # the end of a 3-hour demo day (demo.end_of)


def figure(page: str, ident: str) -> str:
    return re.search(rf'id="{ident}">([^<]+)<', page).group(1)


def kept_browser(kept, moment) -> Browser:
    config = config_module.from_mapping({"server": {"admin_token": ADMIN}})
    config.db = str(kept)
    app = server.App(config, tokens.Keyring(config.secret_path), clock=clock.StillClock(clock.SYSTEM, moment))
    browser = Browser(app)
    browser.sign_in()
    return browser


def kept_page(kept, moment) -> str:
    return kept_browser(kept, moment).get("/").text


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
    assert f"· {whole['proofs']} proofs since the file began (" in page and whole["proofs"] == demo["vastctl_proofs"] > 0
    assert demo["vastctl_as_of"] == whole["as_of"] == END
    assert figure(page, "cost-day") == f"${day['cost']:.2f}" and figure(page, "proofs-day") == str(day["proofs"])
    assert figure(page, "spend-now") == f"${summary['spend_per_hour']:.2f}"
    capacity = summary["capacity_proofs_per_hour"]
    assert figure(page, "capacity") == (f"{capacity:.1f}".rstrip("0").rstrip(".") if capacity % 1 else f"{capacity:g}")
    assert figure(page, "target") == f"{summary['target_proofs_per_hour']:g}"
    # the demo's own printout names the same account beside the simulator's billing
    table = cli("demo", "--hours", "3").out
    assert f"vastctl's account: cost / proofs answered    ${demo['vastctl_cost']:,.2f} / {demo['vastctl_proofs']}" in table
    # a day looked at later, or twice, shows the same figures: nothing runs on past --as-of
    again = kept_page(kept, clock.parse_iso(END))
    assert figure(again, "cost-total") == figure(page, "cost-total")
    later = json.loads(cli("--db", kept, "--as-of", "2031-03-03T04:00:00Z", "cost", "--json").out)
    assert later["cost"] > whole["cost"]  # an hour later the machines left running billed on: --as-of is a moment


@pytest.mark.slow  # a simulated day
def test_each_figure_has_one_form_for_people_and_one_for_machines_wherever_it_is_shown(cli, tmp_path):
    """Proof wait, the counts of proofs and calls, capacity and spend on one kept file: `fleet`, `cost`, the dashboard
    and the demo's printout round each the same way, `fleet --json`, `cost --json` and /metrics give the same exact
    value, and where two counts differ the difference is named with both."""
    kept = tmp_path / "day.db"
    printed = cli("demo", "--hours", "3", "--keep", kept)
    assert printed.code == 0, printed.err
    demo = json.loads(cli("demo", "--hours", "3", "--json").out)  # the same seed: the same day
    fleet_text = cli("--db", kept, "fleet").out
    summary = json.loads(cli("--db", kept, "fleet", "--json").out)["summary"]
    whole = json.loads(cli("--db", kept, "cost", "--json").out)
    cost_text = cli("--db", kept, "cost").out
    browser = kept_browser(kept, clock.parse_iso(END))
    page = browser.get("/").text
    scraped = browser.get("/metrics", headers={"HTTP_AUTHORIZATION": f"Bearer {ADMIN}"})
    assert scraped.status == 200
    metric = samples(scraped.text)

    # proof wait: exact seconds for machines, clock.human_duration for people
    wait = summary["router"]["proof_wait_last_day"]
    assert wait["calls"] > 0
    for quantile, key in (("0.5", "p50_s"), ("0.95", "p95_s"), ("0.99", "p99_s")):
        assert metric[("vastctl_proof_wait_seconds", (("quantile", quantile),))] == wait[key]
    people = [clock.human_duration(wait[key]) for key in ("p50_s", "p95_s", "p99_s")]
    assert f"proof wait p50 <span id=\"proof-wait\">{people[0]}</span> · p95 {people[1]} · p99 {people[2]}" in page
    assert f"proof wait p50/p95/p99 {'/'.join(people)}, " in fleet_text
    own = " / ".join(clock.human_duration(demo[key]) for key in ("proof_wait_p50_s", "proof_wait_p95_s", "proof_wait_p99_s"))
    assert re.search(rf"^proof wait p50 / p95 / p99 +{re.escape(own)}$", printed.out, re.M)
    share = f"{wait['within_max_wait'] * 100:.1f}%"
    assert metric[("vastctl_proofs_within_max_wait_ratio", ())] == wait["within_max_wait"]
    assert figure(page, "within-max-wait") == share and f"{share} within agent.max_wait" in fleet_text
    assert f"done within {clock.human_duration(demo['max_wait_s'])} " in page
    assert re.search(rf"^proofs done within {clock.human_duration(demo['max_wait_s'])} of arriving +", printed.out, re.M)

    # calls answered in the last 24 h: one count, named as such wherever shown
    answered = wait["calls"]
    assert answered == demo["vastctl_calls_last_day"]
    assert metric[("vastctl_route_calls_last_day", (("result", "completed"),))] + \
        metric[("vastctl_route_calls_last_day", (("result", "failed"),))] == answered
    assert f"({answered} calls answered in the last 24 h)" in page and f"({answered} calls answered in the last 24 h)" in fleet_text

    # proofs since the file began (the account): one count, its window named; its differences named beside it
    proofs = whole["proofs"]
    assert proofs == demo["vastctl_proofs"] == metric[("vastctl_cost_proofs", ())]
    assert f"· {proofs} proofs since the file began (" in page and cost_text.splitlines()[2].startswith(f"proofs {proofs} (")
    short, after = demo["proofs"] - proofs, demo["vastctl_calls_after_end"]
    assert short >= 0 and after == proofs - answered  # a 3-hour day: only the calls answered after its end
    if short:
        assert f"${demo['vastctl_cost']:,.2f} / {proofs} (as `vastctl cost` and the dashboard show; {short} fewer than" \
               " simulated: the router counts whole proofs)" in printed.out
    footnote = next(line for line in printed.out.splitlines() if line.startswith("vastctl's account: what"))
    assert f"Its {proofs} proofs are the calls the proof router answered" in footnote
    assert (f"{short} fewer than the {demo['proofs']} simulated" in footnote) == (short > 0)
    if after:
        assert f"{after} were still on a prover at the day's end" in footnote and f"show {answered}." in footnote

    # capacity and spend: the same rounding in `fleet` and on the page, the same exact value in --json and /metrics
    capacity, spend = summary["capacity_proofs_per_hour"], summary["spend_per_hour"]
    assert metric[("vastctl_capacity_proofs_per_hour", ())] == capacity
    assert metric[("vastctl_spend_dollars_per_hour", ())] == spend
    assert f"capacity {figure(page, 'capacity')}/{figure(page, 'target')} proofs/h" in fleet_text
    assert figure(page, "spend-now") == f"${spend:.2f}" and f" · ${spend:.2f}/h" in fleet_text
    assert metric[("vastctl_cost_per_1000_proofs_dollars", ())] == whole["cost_per_1000_proofs"]
    assert figure(page, "cost-per-1000") == f"${whole['cost_per_1000_proofs']:.2f}"
    assert f"${whole['cost_per_1000_proofs']:.2f} per 1,000 proofs" in cost_text


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
