"""What the simulated loop reads every minute costs the same late in a run as early: nothing it reads walks a
table that grows with the run (bench/sim_scaling.py measures the whole: a week beside a day).

The work is counted in SQLite's virtual-machine steps (a progress handler), the same statement on a file
whose history is short and on one whose history is long, the newest rows alike."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from helpers.sim_markets import QUIET, healthy_offer, make_market

from vastctl import clock as clocks
from vastctl import observe
from vastctl.config import Config
from vastctl.facts import deliveries, demand
from vastctl.providers.base import CreateRequest, OfferQuery
from vastctl.providers.sim import SimProvider
from vastctl.reconcile import listing
from vastctl.state import db

T0 = datetime(2031, 3, 1, tzinfo=timezone.utc)
LONG = 5000  # rows of history in the long file


def work(conn, call) -> int:
    """SQLite virtual-machine steps (in hundreds) that `call` makes on `conn`."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        call()
    finally:
        conn.set_progress_handler(None, 0)
    return steps


def samples(conn, start: datetime, queued: list[int]) -> datetime:
    """One demand report a minute from `start`, `queued` in turn; the moment after the last."""
    at = start
    for value in queued:
        demand.report(conn, value, None, now=at)
        at += timedelta(minutes=1)
    return at


def test_the_demand_in_force_reads_the_newest_samples_only(tmp_path):
    tail = [30] * 40 + [0] * 10  # work, then it ran out ten minutes ago
    short = db.connect(tmp_path / "short.db", create=True, now=T0)
    now = samples(short, T0, tail)
    long = db.connect(tmp_path / "long.db", create=True, now=T0)
    start = T0 - timedelta(minutes=LONG)
    assert samples(long, start, [30] * LONG) == T0
    samples(long, T0, tail)
    config = Config()
    config.demand.stale_after = 3600.0
    found = {}

    def current(conn, name):
        found[name] = demand.current(conn, config, now=now)

    few, many = work(short, lambda: current(short, "short")), work(long, lambda: current(long, "long"))
    assert found["short"] == found["long"] and found["long"].empty_since == now - timedelta(minutes=10)
    assert many <= 2 * few + 5, (few, many)


def test_an_observation_and_a_pass_read_the_same_whatever_the_files_history(tmp_path):
    config = Config()
    costs = {}
    for name, history in (("short", 10), ("long", LONG)):
        conn = db.connect(tmp_path / f"{name}.db", create=True, now=T0)
        old = clocks.to_iso(T0 - timedelta(days=2))
        with db.transaction(conn):
            conn.executemany(  # the transitions of machines long gone, and a listing a minute for a while
                "INSERT INTO events (at, kind, uuid, label, from_state, to_state, reason, source)"
                " VALUES (?, 'transition', ?, 'vastctl-old', 'registered', 'running', 'r', 'instance')",
                [(old, f"gone-{i}") for i in range(history)])
            conn.executemany("INSERT INTO vast_listings (at, ok, instances, error) VALUES (?, 1, 0, NULL)",
                             [(old,)] * history)
        costs[name] = (work(conn, lambda conn=conn: observe.observe(conn, config, now=T0)),
                       work(conn, lambda conn=conn: listing._prune_listings(conn, T0)))
    (observed_few, pruned_few), (observed_many, pruned_many) = costs["short"], costs["long"]
    assert observed_many <= 2 * observed_few + 5, costs
    assert pruned_many <= 2 * pruned_few + 5, costs



def test_a_heartbeats_claim_check_reads_as_little_late_in_a_machines_life_as_early(tmp_path):
    """A machine's calls grow all its life. Its heartbeat's claim check counts them once; a later claim that
    count clears reads no more: a machine with thousands of calls behind it costs what one with ten does. A
    claim past what the router delivered is still found."""
    def calls(n: int) -> list[deliveries.CallRecord]:
        at = clocks.to_iso(T0 - timedelta(minutes=5))
        return [{"at": at, "request_id": "r", "kind": "porep", "uuid": "u-a", "label": "vastctl-a", "result": "completed",
                 "held_ms": 0, "prover_ms": 60_000, "attempt": 1, "size_bytes": 10} for _ in range(n)]

    def claim(conn, proofs: int) -> None:
        conn.execute("UPDATE instances SET proofs_total = ? WHERE uuid = 'u-a'", (proofs,))
        conn.commit()

    costs, files = {}, {}
    for name, history in (("short", 10), ("long", LONG)):
        conn = files[name] = db.connect(tmp_path / f"{name}.db", create=True, now=T0)
        since = clocks.to_iso(T0 - timedelta(hours=2))
        conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since) VALUES ('u-a', 'vastctl-a',"
                     " 'running', ?, ?)", (since, since))
        deliveries.record_calls(conn, calls(history))
        claim(conn, history)
        assert not deliveries.check_claim(conn, "u-a", bench_proofs=6, now=T0)  # counted: the claim is within it
        deliveries.record_calls(conn, calls(1))
        claim(conn, history + 1)
        costs[name] = work(conn, lambda conn=conn: deliveries.check_claim(conn, "u-a", bench_proofs=6, now=T0))
    assert costs["long"] <= 2 * costs["short"] + 5, costs
    claim(files["long"], 2 * LONG)  # past the count kept, and past what the router delivered
    assert deliveries.check_claim(files["long"], "u-a", bench_proofs=6, now=T0)
    (reason,) = files["long"].execute("SELECT reason FROM events WHERE kind = 'claim_disagrees'").fetchone()
    assert f"the proof router saw {LONG + 1} come back from it" in reason


def test_the_bench_rates_are_worked_out_again_only_when_a_benchmark_changed(tmp_path, monkeypatch):
    """observe.bench_rates reads every machine that ever benchmarked, twice a simulated minute. Heartbeats change
    the live machines' rows every minute but not their benchmarks: the medians kept are returned without
    building every machine's benchmark again. A new benchmark is seen at once."""
    conn = db.connect(tmp_path / "state.db", create=True, now=T0)
    since = clocks.to_iso(T0 - timedelta(days=2))
    with db.transaction(conn):
        conn.executemany("INSERT INTO instances (uuid, label, state, created_at, state_since, gpu_name, machine_id,"
                         " bench_rate) VALUES (?, ?, 'killed', ?, ?, 'RTX 4090', ?, ?)",
                         [(f"u-{n}", f"vastctl-{n}", since, since, 40000 + n, 50.0 + n % 7) for n in range(200)])
    built = []
    benches = observe.instances.benches
    monkeypatch.setattr(observe.instances, "benches", lambda c: built.append(1) or benches(c))
    first = observe.bench_rates(conn)
    conn.execute("UPDATE instances SET last_heartbeat_at = ? WHERE uuid = 'u-3'", (clocks.to_iso(T0),))
    conn.commit()
    assert observe.bench_rates(conn) == first and len(built) == 1
    conn.execute("UPDATE instances SET bench_rate = 90.0 WHERE uuid = 'u-3'")
    conn.commit()
    models, hosts = observe.bench_rates(conn)
    assert len(built) == 2 and hosts[40003] == 90.0 and hosts != first[1]
    assert observe.bench_rates(conn, ["u-3"])[1].get(40003) is None and len(built) == 3  # a liar left out

def test_the_markets_totals_read_its_live_instances_and_remember_the_destroyed_ones(tmp_path):
    market = make_market(tmp_path, rates=QUIET)

    def rent(label: str) -> int:
        (offer,) = market.sim.search_offers(OfferQuery(limit=1))  # the cheapest offer free now
        return market.sim.create_instance(CreateRequest(offer_id=offer.id, image="img", disk_gb=150, label=label,
                                                        onstart="", env={}))

    for number in range(40):  # rented and released, again and again
        market.sim.destroy_instance(rent(f"vastctl-{number}"))
        market.advance(60)
    live = rent("vastctl-live")
    first = market.sim.totals()
    few = work(market.conn, market.sim.totals)
    assert len(first.instances) == 41 and [r["vast_id"] for r in first.instances][-1] == live
    for number in range(40, 200):
        market.sim.destroy_instance(rent(f"vastctl-{number}"))
        market.advance(60)
    later = market.sim.totals()
    many = work(market.conn, market.sim.totals)
    assert len(later.instances) == 201 and many <= 2 * few + 5, (few, many)
    assert later.cost == sum(r["cost"] for r in later.instances) and later.cost > first.cost


def test_the_totals_follow_a_market_another_process_moved(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    offer = healthy_offer(market)
    vast_id = market.sim.create_instance(CreateRequest(offer_id=offer.id, image="img", disk_gb=150, label="vastctl-a",
                                                       onstart="", env={}))
    market.advance(3600)
    assert market.sim.totals().instances[0]["destroyed_at"] is None
    other = SimProvider(market.conn, market.sim.reports, clock=market.clock, rates=QUIET)  # another vastctl
    other.destroy_instance(vast_id)
    market.advance(3600)
    (record,) = market.sim.totals().instances
    assert record["destroyed_at"] == T0 + timedelta(hours=1)
    assert market.sim.totals().cost == other.totals().cost
    assert market.sim.totals().faults == other.totals().faults
