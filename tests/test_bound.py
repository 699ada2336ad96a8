"""The lower bound is the least a fleet could pay: on markets built by hand whose least cost is known exactly."""

from __future__ import annotations

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
