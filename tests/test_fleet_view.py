"""`vastctl fleet` as an operator reads it: the counted/h column the capacity sums, the legend under the table,
joined and for how long, proof waits in words, an interruptible machine's bid and its outbid pause; the same
columns on the dashboard's fleet table."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape

import pytest
from helpers.dashboard import Browser, make_app, section
from helpers.routed_calls import kept_full

from vastctl import clock
from vastctl.facts import deliveries
from vastctl.serving.dashboard_tables import FLEET_HEAD
from vastctl.state import db

WAIT_S = 216.738  # each routed call's proof wait: 3m 36.738s, "3m" in words as the dashboard says it


def machine(conn, name, *, at, bench, since, **columns):
    """A running machine, as the fleet tests write one; `columns` set the rest of its row."""
    conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, gpu_name, num_gpus, bench_rate)"
                 " VALUES (?, ?, 'running', ?, ?, 'RTX 4090', 1, ?)",
                 (f"u-{name}", name, clock.to_iso(at - timedelta(hours=1)), clock.to_iso(at - since), bench))
    for key, value in columns.items():
        conn.execute(f"UPDATE instances SET {key} = ? WHERE uuid = ?", (value, f"u-{name}"))
    return f"u-{name}"


def build(db_path):
    """Four running machines, each ages 30 s past a whole minute (so a second or two of test time shows the same):

    a  joined 12m ago, the router kept it full: counted at the router's figure (`*`)
    b  its tunnel never answered for 4m: not joined, not counted (the agent still counts it)
    c  interruptible, vast stopped it for a higher bid 7m ago: outbid, not counted
    d  interruptible, bidding and running: counted at its bench rate
    """
    at = clock.SYSTEM.now()
    conn = db.connect(db_path, create=True, now=at)
    try:
        with db.transaction(conn):
            a = machine(conn, "vastctl-a", at=at, bench=80.0, since=timedelta(minutes=30, seconds=30),
                        tunnel_port=40001, joined_at=clock.to_iso(at - timedelta(minutes=12, seconds=30)))
            machine(conn, "vastctl-b", at=at, bench=81.0, since=timedelta(minutes=4, seconds=30), tunnel_port=40002)
            machine(conn, "vastctl-c", at=at, bench=70.0, since=timedelta(hours=1), bid=0.35, dph=0.35, vast_id=7003,
                    vast_status="stopped", vast_seen_at=clock.to_iso(at - timedelta(minutes=1)),
                    outbid_since=clock.to_iso(at - timedelta(minutes=7, seconds=30)))
            machine(conn, "vastctl-d", at=at, bench=50.0, since=timedelta(hours=1), bid=0.3, dph=0.3, vast_id=7004,
                    vast_status="running", vast_seen_at=clock.to_iso(at - timedelta(minutes=1)))
        deliveries.record_calls(conn, kept_full(a, prover_s=WAIT_S, now=at))
    finally:
        conn.close()
    return at


@pytest.fixture
def fleet_page(db_path):
    """A signed-in browser on the dashboard of the state file at db_path (its own name: no shared fixture's)."""
    browser = Browser(make_app(db_path))
    browser.sign_in()
    return browser


def fleet_row(page: str, label: str) -> list[str]:
    """The cells of a machine's row of the dashboard's fleet table."""
    row = section(page, "fleet").split(f'data-label="{label}">', 1)[1].split("</tr>", 1)[0]
    return re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)


def table(out: str) -> tuple[dict[str, dict[str, str]], list[str]]:
    """`fleet`'s table as label → {column: cell}, and the lines after it."""
    lines = out.splitlines()
    head = re.split(r"\s{2,}", lines[0].strip())
    rows = {}
    for line in lines[1:]:
        if not line.startswith("vastctl-"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = dict(zip(head, cells))
    return rows, lines[1 + len(rows):]


def test_the_counted_column_sums_to_the_capacity_and_a_machine_the_router_cannot_reach_counts_nothing(ready, cli,
                                                                                                       db_path):
    build(db_path)
    view = json.loads(cli("fleet", "--json").out)
    by_label = {i["label"]: i for i in view["instances"]}
    a, b, c, d = (by_label[f"vastctl-{x}"] for x in "abcd")
    assert a["rate_source"] == "router" and a["counted_rate"] == a["expected_rate"] > 80  # it proved more than its bench
    assert (b["counted_rate"], c["counted_rate"], d["counted_rate"]) == (None, None, 50.0)
    summary = view["summary"]
    assert summary["capacity_proofs_per_hour"] == round(a["counted_rate"] + 50.0, 1)
    assert summary["not_joined_proofs_per_hour"] == 81.0  # b, which the agent's sizing counts
    result = cli("fleet")
    assert result.code == 0
    rows, after = table(result.out)
    assert [name for name in rows["vastctl-a"]][:9] == ["label", "state", "vast", "vast_id", "gpu", "$/h", "bid", "bench",
                                                       "proofs/h"]
    counted = [rows[label]["counted/h"] for label in sorted(rows)]
    assert counted == [f"{a['counted_rate']:.1f}", "-", "-", "50.0"]
    assert rows["vastctl-a"]["routed/h"] == f"{a['routed_rate']:.1f}*"
    headline = after[2]  # after the legend and the work line
    capacity = float(re.search(r"capacity ([0-9.]+)/", headline).group(1))
    assert capacity == round(sum(float(x) for x in counted if x != "-"), 1) == summary["capacity_proofs_per_hour"]
    assert "proofs/h (+81 not joined) · $" in headline


def test_the_line_under_the_table_says_what_the_columns_and_the_star_mean(ready, cli, db_path):
    build(db_path)
    rows, after = table(cli("fleet").out)
    legend = after[0]
    assert legend.startswith("counted/h: the rate capacity counts it at (they sum to the capacity below; - not counted)")
    assert "routed/h: proved through the proof router in the last hour, * where its figures set the rate counted" in legend
    assert "joined: the manager reaches its daemon through its tunnel (not joined: not counted)" in legend
    assert "bid: $/h bid for an interruptible machine" in legend and "contact: its last report of any kind" in legend
    assert after[2].startswith("4 running · capacity ")


def test_joined_yes_no_and_for_how_long(ready, cli, db_path):
    at = build(db_path)
    rows, _ = table(cli("fleet").out)
    assert [rows[label]["joined"] for label in sorted(rows)] == ["yes 12m", "no 4m", "-", "-"]
    by_label = {i["label"]: i for i in json.loads(cli("fleet", "--json").out)["instances"]}
    a, b = by_label["vastctl-a"], by_label["vastctl-b"]
    assert (a["joined"], a["joined_at"], a["not_joined_since"]) == (
        True, clock.display_iso(clock.to_iso(at - timedelta(minutes=12, seconds=30))), None)
    assert (b["joined"], b["joined_at"], b["not_joined_since"]) == (
        False, None, clock.display_iso(clock.to_iso(at - timedelta(minutes=4, seconds=30))))
    assert by_label["vastctl-d"]["joined"] is None and by_label["vastctl-d"]["not_joined_since"] is None


def test_proof_waits_are_words_in_the_table_and_exact_seconds_in_json(ready, cli, db_path):
    build(db_path)
    wait = json.loads(cli("fleet", "--json").out)["summary"]["router"]["proof_wait_last_day"]
    assert (wait["calls"], wait["p50_s"], wait["p99_s"]) == (60, WAIT_S, WAIT_S)
    (router,) = [line for line in cli("fleet").out.splitlines() if line.startswith("router:")]
    assert "proof wait p50/p95/p99 3m/3m/3m, 100.0% within agent.max_wait (60 calls answered in the last 24 h)" in router
    assert "216" not in router


def test_an_interruptible_machine_shows_its_bid_and_since_when_it_is_outbid(ready, cli, db_path):
    at = build(db_path)
    rows, _ = table(cli("fleet").out)
    c, d = rows["vastctl-c"], rows["vastctl-d"]
    assert (c["state"], c["vast"], c["bid"], c["why"]) == ("running", "outbid 7m", "0.350",
                                                          "vast stopped it for a bid over its $0.35/h")
    assert (d["vast"], d["bid"], rows["vastctl-a"]["bid"]) == ("running", "0.300", "-")
    by_label = {i["label"]: i for i in json.loads(cli("fleet", "--json").out)["instances"]}
    assert by_label["vastctl-c"]["bid"] == 0.35
    assert by_label["vastctl-c"]["outbid_since"] == clock.display_iso(clock.to_iso(at - timedelta(minutes=7, seconds=30)))
    assert (by_label["vastctl-d"]["bid"], by_label["vastctl-d"]["outbid_since"]) == (0.3, None)
    assert (by_label["vastctl-a"]["bid"], by_label["vastctl-a"]["outbid_since"]) == (None, None)


def test_a_fleet_without_tunnels_bids_or_router_keeps_its_columns_and_counts_every_running_machine(ready, cli, db_path):
    at = clock.SYSTEM.now()
    conn = db.connect(db_path, now=at)
    with db.transaction(conn):
        machine(conn, "vastctl-a", at=at, bench=68.0, since=timedelta(minutes=5))
    conn.close()
    rows, after = table(cli("fleet").out)
    assert list(rows["vastctl-a"])[:10] == ["label", "state", "vast", "vast_id", "gpu", "$/h", "bench", "proofs/h",
                                            "counted/h", "for"]
    assert after[0] == ("counted/h: the rate capacity counts it at (they sum to the capacity below; - not counted)"
                        " · contact: its last report of any kind")
    assert after[2].startswith("1 running · capacity 68/0 proofs/h · $")


def test_the_dashboards_fleet_table_has_the_routed_counted_and_joined_columns(fleet_page, db_path):
    build(db_path)
    page = fleet_page.get("/").text
    assert FLEET_HEAD[6:12] == ("proofs/h", "routed/h", "counted/h", "for", "beat", "joined")
    assert "".join(f"<th>{unescape(h) or ''}</th>" for h in FLEET_HEAD) in unescape(section(page, "fleet"))
    cells = {label: dict(zip(FLEET_HEAD, map(unescape, fleet_row(page, label)))) for label in
             ("vastctl-a", "vastctl-b", "vastctl-c", "vastctl-d")}
    a = cells["vastctl-a"]
    assert a["routed/h"].endswith("*") and a["counted/h"] != "-" and a["joined"] == "yes 12m"
    assert (cells["vastctl-b"]["counted/h"], cells["vastctl-b"]["joined"]) == ("-", "no 4m")
    assert (cells["vastctl-c"]["counted/h"], cells["vastctl-c"]["joined"]) == ("-", "-")
    assert cells["vastctl-c"]["vast"].startswith("outbid 7m")
    assert cells["vastctl-c"]["why"] == "vast stopped it for a bid over its $0.35/h"
    assert cells["vastctl-d"]["counted/h"] == "50"
    capacity = re.search(r'id="capacity">([0-9.]+)<', page).group(1)
    assert float(capacity) == round(float(a["counted/h"]) + 50.0, 1)
    assert 'id="fleet-legend">counted/h: the rate the capacity counts a machine at' in page
    assert "+81 not joined" in page  # the capacity card names what the router cannot reach
    broken = page.split('id="glance-broken"', 1)[1].split("</div>", 1)[0]
    assert "cannot reach through their tunnel: 81 proofs/h not counted" in broken  # not "Broken: nothing"


def test_the_dashboard_shows_routed_and_joined_only_where_the_fleet_has_them(fleet_page, db_path):
    at = clock.SYSTEM.now()
    conn = db.connect(db_path, now=at)
    with db.transaction(conn):
        machine(conn, "vastctl-a", at=at, bench=68.0, since=timedelta(minutes=5))
    conn.close()
    page = fleet_page.get("/").text
    fleet = unescape(section(page, "fleet").split("</section>", 1)[0])
    heads = re.findall(r"<th>(.*?)</th>", fleet)
    assert heads == ["label", "state", "vast", "GPU", "$/h", "bench", "proofs/h", "counted/h", "for", "beat", "why", ""]
    assert dict(zip(heads, map(unescape, fleet_row(page, "vastctl-a"))))["counted/h"] == "68"
    legend = re.search(r'id="fleet-legend">(.*?)</p>', fleet).group(1)
    assert legend.startswith("counted/h: the rate the capacity counts a machine at") and "routed/h" not in legend
