"""The lower bound is the least a fleet could pay: on markets built by hand whose least cost is known exactly."""

from __future__ import annotations

import math

import pytest

from vastctl import bound
from vastctl.bound import Rentable

HOUR = 60


def flat(price, minutes, taken=()):
    """$/h `price` every minute, except in the hours listed in `taken` (another renter holds the host)."""
    return [None if minute // HOUR in taken else price for minute in range(minutes)]


def test_no_work_costs_nothing():
    host = Rentable(key=1, rate=60, storage_dph=0.0, prices=flat(1.0, 200))
    assert bound.least_cost([host], [0.0] * 120, 0).cost == 0


def test_a_steady_stream_on_two_hosts_pays_for_its_proofs_at_their_price():
    minutes = 120
    hosts = [Rentable(key=k, rate=60, storage_dph=0.0, prices=flat(1.0, bound.minutes(minutes, 20 * 60)))
             for k in (1, 2)]
    found = bound.least_cost(hosts, [1.0] * minutes, 20 * 60)
    assert found.cost == pytest.approx(2.0, abs=1e-6)  # 120 proofs at 60/h for $1/h: $2, however scheduled
    assert found.proofs == pytest.approx(120)


def test_no_host_no_bound():
    with pytest.raises(ArithmeticError):
        bound.least_cost([], [1.0] * 30, 0)


def test_a_host_taken_mid_day_is_kept_a_rising_price_is_locked_and_work_waits():
    """Known exactly: host A (60/h) costs $1/h in hour 0 and $3/h from hour 1 on, and another renter holds it
    in hour 1; host B (60/h) costs $2/h all day. Work: 10 proofs arriving at minute 0 and 10 more at minute 30,
    then 60/h from hour 1 to hour 3, max_wait 30 minutes.

    Every proof costs at least 1/60 $ (an hour of the cheapest price anywhere, $1/h, buys 60), so 140 proofs
    cost at least $140/60; and that is paid: rent A in hour 0 at $1/h and keep it, through hour 1 (taken:
    nobody else may rent it, we hold it) and hour 2 (its offer rose to $3/h: we keep $1/h). A proves from the
    block after its rental (minute 10): the 10 proofs of minute 0 by minute 30 on half of it, the 10 of minute
    30 by minute 60 on a third, then the 120 as they come on all of it. Without keeping A through hour 1, or
    its price through hour 2, B's $2/h would do them; without waiting, the first 10 could not be done at all.
    """
    horizon = bound.minutes(180, 30 * 60)
    a = [1.0 if m < 60 else (None if m < 120 else 3.0) for m in range(horizon)]
    hosts = [Rentable(key=1, rate=60, storage_dph=0.0, prices=a),
             Rentable(key=2, rate=60, storage_dph=0.0, prices=flat(2.0, horizon))]
    arrivals = [0.0] * 180
    arrivals[0] = arrivals[30] = 10.0
    for minute in range(60, 180):
        arrivals[minute] = 1.0
    found = bound.least_cost(hosts, arrivals, 30 * 60)
    assert found.cost == pytest.approx(140 / 60, abs=1e-6)


def test_a_host_released_cannot_be_taken_back_at_its_old_price_but_a_stopped_one_can():
    """Work from minute 10 to 60 and 180 to 240, one proof a minute, none may wait. Host A (60/h): $1/h in hour
    0, then $4/h; host B (60/h) $2/h all day; disks $0.1/h. Releasing A after hour 0 and renting B for hour 3
    costs 50 min at $1 and 60 at $2: $2.83. Keeping A, stopped from minute 60 to 180 at its disk's price,
    costs 110 min proving at $1/h and 120 min stopped at $0.1/h: $2.03, the least (a proof costs at least
    1/60 $, and A at $1/h can only be held from hour 0: its share from minute 60 on only falls)."""
    horizon = bound.minutes(240, 0)
    a = [1.0 if m < 60 else 4.0 for m in range(horizon)]
    hosts = [Rentable(key=1, rate=60, storage_dph=0.1, prices=a),
             Rentable(key=2, rate=60, storage_dph=0.1, prices=flat(2.0, horizon))]
    arrivals = [0.0] * 240
    for minute in list(range(10, 60)) + list(range(180, 240)):
        arrivals[minute] = 1.0
    found = bound.least_cost(hosts, arrivals, 0)
    assert found.cost == pytest.approx(110 / 60 * 1.0 + 120 / 60 * 0.1, abs=1e-6)


def daily(base, minutes, phase):
    """$/h swinging ±8% over each day around `base`, as the simulated market's offers do."""
    return [round(base * (1 + 0.08 * math.sin(2 * math.pi * minute / 1440 + phase)), 4) for minute in range(minutes)]


def test_the_program_grows_with_the_horizon_not_its_square(monkeypatch):
    """Eight days of the same work on the same hosts make a program about twice four days', not four times: a
    rental is held no longer than until its host's next hour as cheap (a day later at the latest here)."""
    import scipy.optimize

    sizes = []
    solve = scipy.optimize.linprog

    def counting(c, *args, **kwargs):
        sizes.append(len(c))
        return solve(c, *args, **kwargs)

    monkeypatch.setattr(scipy.optimize, "linprog", counting)

    def program(days):
        minutes = days * 1440
        horizon = bound.minutes(minutes, 45 * 60)
        hosts = [Rentable(key=k, rate=60, storage_dph=0.01, prices=daily(1.0 + k / 10, horizon, k)) for k in range(4)]
        sizes.clear()
        found = bound.least_cost(hosts, [1.5 + math.sin(minute / 200) for minute in range(minutes)], 45 * 60)
        return sizes[-1], found.cost

    (four, four_cost), (eight, eight_cost) = program(4), program(8)
    assert eight <= 2.2 * four
    assert eight_cost == pytest.approx(2 * four_cost, rel=0.05)



def test_rentals_held_longer_only_where_it_pays_give_the_least_cost_of_holding_every_one_as_long_as_it_may(
        monkeypatch):
    """The program first holds each rental through the blocks of its own hour, then longer only where its prices
    say that lowers the cost: on three days of prices swinging daily (a rental bought at a day's low is worth
    holding through the dearer hours after it) it finds the least cost of the program that holds every rental
    until its host's next hour as cheap, and it did have to hold some longer."""
    minutes = 3 * 1440
    horizon = bound.minutes(minutes, 45 * 60)
    hosts = [Rentable(key=k, rate=60, storage_dph=0.01, prices=daily(1.0 + k / 10, horizon, k)) for k in range(4)]
    arrivals = [1.5 + math.sin(minute / 200) for minute in range(minutes)]
    held_longer = []
    find_longer = bound._held_longer

    def recording(*args):
        held_longer.append(find_longer(*args))
        return held_longer[-1]

    monkeypatch.setattr(bound, "_held_longer", recording)
    found = bound.least_cost(hosts, arrivals, 45 * 60)
    assert any(held_longer)
    monkeypatch.setattr(bound, "replace", lambda cohort, last: cohort)  # every rental held as long as it may be
    assert found.cost == pytest.approx(bound.least_cost(hosts, arrivals, 45 * 60).cost, abs=1e-6)

# --- rentals by bid: the market's rival bids, known in hindsight ---------------------------------------------


def outbid_in_hour_one(blocks):
    """A rival's bid of $2/h holds the host through hour 1 (blocks 6-11): a bid proves then only at $2/h."""
    return [2.0 if 6 <= t < 12 else 0.0 for t in range(blocks)]


def work_from_block_one(minutes):
    """One proof a minute from minute 10 (the first block no rental can prove in) to the end; none may wait."""
    return [0.0 if minute < bound.BLOCK_MIN else 1.0 for minute in range(minutes)]


def test_a_host_outbid_in_an_hour_is_not_rented_at_its_min_bid_then_but_on_demand():
    """Known exactly: host A (60/h) by bid at $0.5/h, outbid by a $2/h rival through hour 1, and on demand at
    $1.5/h; one proof a minute in blocks 1-17, none waiting: each block needs the whole host. The bid proves in
    hours 0 and 2 at $0.5/h (11 blocks; the block after the rival leaves by a bid rented in hour 1, while the
    rival held the host: renting is not proving), and in hour 1 on demand at $1.5/h (6 blocks): never at
    $0.5/h while outbid, as the bound that knew no rival did (17 blocks at $0.5/h)."""
    minutes = 180
    horizon = bound.minutes(minutes, 0)
    blocks = horizon // bound.BLOCK_MIN
    by_bid = Rentable(key=-1, rate=60, storage_dph=0.0, prices=flat(0.5, horizon), rival=outbid_in_hour_one(blocks),
                      machine=1)
    on_demand = Rentable(key=1, rate=60, storage_dph=0.0, prices=flat(1.5, horizon))
    never_outbid = Rentable(key=-1, rate=60, storage_dph=0.0, prices=flat(0.5, horizon), machine=1)
    work = work_from_block_one(minutes)
    assert bound.least_cost([never_outbid, on_demand], work, 0).cost == pytest.approx(17 / 6 * 0.5, abs=1e-6)
    found = bound.least_cost([by_bid, on_demand], work, 0)
    assert found.cost == pytest.approx(11 / 6 * 0.5 + 6 / 6 * 1.5, abs=1e-6)
    assert bound.least_cost([by_bid], work, 0).cost == pytest.approx(11 / 6 * 0.5 + 6 / 6 * 2.0, abs=1e-6)


def test_a_host_is_held_by_one_of_its_offers_at_a_time():
    """The bid and the on-demand offer of one host are one machine: two at once would prove twice its rate. Work
    of 120/h (two hosts' worth) in blocks 1-5 cannot be done on host 1's two offers alone."""
    horizon = bound.minutes(60, 0)
    work = [0.0 if minute < bound.BLOCK_MIN else 2.0 for minute in range(60)]
    offers = [Rentable(key=-1, rate=60, storage_dph=0.0, prices=flat(0.5, horizon), machine=1),
              Rentable(key=1, rate=60, storage_dph=0.0, prices=flat(1.5, horizon))]
    with pytest.raises(ArithmeticError):
        bound.least_cost(offers, work, 0)
    other = Rentable(key=2, rate=60, storage_dph=0.0, prices=flat(1.5, horizon))
    assert bound.least_cost([*offers, other], work, 0).cost == pytest.approx(5 / 6 * (0.5 + 1.5), abs=1e-6)


@pytest.mark.parametrize("seed", [5, 351])
def test_the_bid_aware_bound_never_exceeds_the_on_demand_one_and_knows_the_markets_rivals(tmp_path, seed):
    """On the demo's market (12 hours): the bid-aware bound is at most the on-demand one (it may rent every host on
    demand too), above what the same hosts would cost by bid if no rival ever came, and every block the bound
    prices a bid's rival in is one the market's own process holds the host over that bid throughout."""
    from vastctl import markets
    from vastctl.clock import VirtualClock
    from vastctl.demo import figures, setting
    from vastctl.providers import sim_market
    from vastctl.state import db

    options = setting.DemoOptions(hours=12, seed=seed)
    config = setting.demo_config(tmp_path, options)
    clock = VirtualClock(setting.START)
    conn = db.connect(config.db_path, now=clock.now(), create=True)
    market = markets.get_provider(config, conn=conn, clock=clock)
    least = figures.least_costs(market, config, setting.DemandCurve(seed), options.minutes)
    assert least["interruptible"].cost <= least["honest"].cost + 1e-6

    calm = sim_market.FailureRates(**{**vars(market.rates), "outbid_per_hour": 0.0})
    rates = market.rates
    market.rates = calm
    try:
        never_outbid = figures.least_costs(market, config, setting.DemandCurve(seed), options.minutes)
    finally:
        market.rates = rates
    assert never_outbid["interruptible"].cost < least["interruptible"].cost

    start, span = setting.START.timestamp(), bound.BLOCK_MIN * 60
    held = 0
    for host in market.hosts()[:40]:
        floors = sim_market.rival_floors(market.seed, host, start, span, 72, rates)
        for number, floor in enumerate(floors):
            if floor > 0:
                held += 1
                for at in range(int(start + number * span), int(start + (number + 1) * span), 30):
                    spell = sim_market.outbid(market.seed, host, at, floor - 1e-6, rates)
                    assert spell is not None and spell.start <= at < spell.end
    assert held > 0
    conn.close()


def test_the_program_names_each_rentals_proving_shares_block_by_block():
    """bound.program() says where each rental's proving shares (y) are, for programs built on it (the whole-host
    bound of bench/whole_hosts.py makes them whole): each is a column of its block's capacity row at the host's
    rate, and a share of the host's one-at-a-time row, in the cohort's own blocks."""
    horizon = bound.minutes(120, 20 * 60)
    hosts = [Rentable(key=1, rate=60, storage_dph=0.1, prices=flat(1.0, horizon)),
             Rentable(key=2, rate=30, storage_dph=0.1, prices=flat(2.0, horizon, taken=(0,)))]
    work = bound.work_by_block([1.0] * 120, 20 * 60)
    cohorts = {host.key: bound.cohorts_of(host, work.blocks) for host in hosts}
    built = bound.program(hosts, cohorts, work.blocks, work.may, work.due)
    expected = [(host, cohort) for host in hosts for cohort in cohorts[host.key]]
    assert [price for price, _ in built.proving] == [cohort.price for _, cohort in expected]
    matrix = built.matrix.tocsc()
    for (host, cohort), (_, columns) in zip(expected, built.proving):
        assert len(columns) == cohort.last - cohort.first
        for block, column in zip(range(cohort.first, cohort.last), columns):
            rows = dict(zip(matrix[:, column].indices, matrix[:, column].data))
            assert rows[built.first_capacity + block] == pytest.approx(-host.rate * bound.BLOCK_MIN / 60)
            assert built.cost[column] == pytest.approx(cohort.price * bound.BLOCK_MIN / 60)  # proving pays the price
    # solved as it is built, it is the least cost least_cost() finds
    from scipy.optimize import linprog
    solved = linprog(built.cost, A_ub=built.matrix, b_ub=built.upper, bounds=built.limits, method="highs")
    assert solved.fun == pytest.approx(bound.least_cost(hosts, [1.0] * 120, 20 * 60).cost, abs=1e-6)
