"""One clock: a simulated day of the whole control loop writes only simulated time into the state file.

The market, the machines' boot reports, operator launches, reconcile, agent-step, demand, settings, leases
and the migrations all take their time from one VirtualClock set years away from today, so a time read
from the system clock anywhere below the CLI would show up here as a time outside the simulated window.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone

import pytest
from helpers.sim_markets import START, make_market

from vastctl import clock as clocks
from vastctl import launches, reconcile
from vastctl.agent import step
from vastctl.errors import VastctlError
from vastctl.facts import demand
from vastctl.state import settings
from vastctl.views import fleet

HOURS = 24
# An ISO-8601 moment as the file holds them: `…T…Z` in columns, `… …+00:00` inside JSON written with default=str
ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})?")
# Tables the control loop writes with a time in them; each must hold at least one for the scan to mean anything
STAMPED = ("events", "actions", "agent_steps", "demand_samples", "migrations", "vast_listings", "settings",
           "instances", "blocklist")


def queued_at(minute: int) -> int:
    """A daily swing of queued proofs, with a quiet spell (nothing queued) before dawn."""
    hour = minute / 60
    if 3 <= hour < 5:
        return 0
    return int(300 + 250 * math.sin(2 * math.pi * hour / 24))


pytestmark = pytest.mark.slow  # every test reads one simulated day of the whole control loop


class Day:
    """A finished simulated day: the market, and the leases seen held while it ran."""

    def __init__(self, market, leases: list[dict]):
        self.market, self.leases = market, leases
        self.conn, self.config, self.end = market.conn, market.config, market.clock.now()


@pytest.fixture(scope="module")
def day(tmp_path_factory) -> Day:
    market = make_market(tmp_path_factory.mktemp("one-clock"), seed=11, failures="default")
    conn, sim, config, virtual = market.conn, market.sim, market.config, market.clock
    leases: list[dict] = []

    def watching(call):  # every market call is made under a lease: record the leases as they are held
        def wrapped(*args, **kwargs):
            leases.extend(dict(row) for row in conn.execute("SELECT * FROM locks"))
            return call(*args, **kwargs)
        return wrapped

    sim.list_instances, sim.search_offers = watching(sim.list_instances), watching(sim.search_offers)
    demand.report(conn, queued_at(0), None, now=virtual.now())
    settings.set_value(conn, config, "target_proofs_per_hour", 300, now=virtual.now())
    launches.launch(conn, sim, config, gpu="RTX 4090", count=2, now=virtual.now())
    for minute in range(HOURS * 60):
        if minute % 5 == 0:
            demand.report(conn, queued_at(minute), None, now=virtual.now())
        if minute == 12 * 60:
            settings.set_value(conn, config, "target_proofs_per_hour", 450, now=virtual.now())
            fleet.notify(conn, "evening peak expected", now=virtual.now())
        try:  # a failed or distrusted listing is the pass's answer (exit 1); the next minute tries again
            reconcile.run_pass(conn, sim, config, clock=virtual)
        except VastctlError:
            pass
        step.run_step(conn, sim, config, clock=virtual, policy="rules", env={})
        virtual.advance(60)
    return Day(market, leases)


def moments(text: str) -> list[datetime]:
    found = []
    for match in ISO.findall(text):
        moment = datetime.fromisoformat(match.replace("Z", "+00:00"))
        found.append(moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc))
    return found


def test_the_simulated_window_is_far_from_the_wall_clock(day):
    assert not START - timedelta(days=30) <= clocks.SYSTEM.now() <= day.end + timedelta(days=30)


def test_a_simulated_day_writes_no_wall_clock_time_into_the_file(day):
    # the furthest ahead the loop stamps: a blocklist entry's expiry, a lease's. The market's own tables
    # (sim_*) also hold its plans, a fault due days ahead: for them only the start of the window holds.
    horizon = day.end + timedelta(seconds=max(day.config.vast.blocklist_ttl, reconcile.LEASE_TTL_S))
    unbounded = datetime.max.replace(tzinfo=timezone.utc)
    counted: dict[str, int] = {}
    tables = [row[0] for row in day.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                                 " AND name NOT LIKE 'sqlite_%'")]
    for table in tables:
        counted[table] = 0
        for row in day.conn.execute(f"SELECT * FROM {table}"):
            for column, value in zip(row.keys(), row):
                if not isinstance(value, str):
                    continue
                for moment in moments(value):
                    assert START <= moment <= (unbounded if table.startswith("sim_") else horizon), \
                        (table, column, value[:200])
                    counted[table] += 1
    empty = [table for table in STAMPED if not counted.get(table)]
    assert not empty, counted  # the loop really wrote each of these


def test_the_day_ran_the_whole_control_loop(day):
    count = lambda sql: day.conn.execute(sql).fetchone()[0]  # noqa: E731
    assert count("SELECT count(*) FROM agent_steps") == HOURS * 60
    assert count("SELECT count(*) FROM vast_listings WHERE ok = 1") > HOURS * 60 * 0.9
    assert count("SELECT count(*) FROM actions WHERE actor = 'agent' AND kind = 'launch' AND ok = 1") > 0
    assert count("SELECT count(*) FROM actions WHERE actor = 'operator' AND kind = 'launch' AND ok = 1") == 2
    assert count("SELECT count(*) FROM events WHERE source = 'reconcile' AND to_state = 'killed'") > 0
    assert count("SELECT count(*) FROM events WHERE source = 'instance' AND to_state = 'running'") > 0
    applied = {row[0] for row in day.conn.execute("SELECT applied_at FROM migrations")}
    assert applied == {clocks.to_iso(START)}  # stamped at the file's (virtual) creation, not by SQLite's clock


def test_leases_were_taken_and_renewed_on_simulated_time(day):
    names = {lease["name"] for lease in day.leases}
    assert {"reconcile", "agent-step", "launch"} <= names
    for lease in day.leases:
        acquired, expires = clocks.from_iso(lease["acquired_at"]), clocks.from_iso(lease["expires_at"])
        assert START <= acquired <= day.end and acquired < expires <= day.end + timedelta(hours=1), lease
