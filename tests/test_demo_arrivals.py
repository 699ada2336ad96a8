"""The simulated day reports when its look-ahead arrives as a real Curio's script would: its curve's proofs per
10 minutes, exact within the look-ahead and 0 beyond it, and the proofs further out as `later`."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest

from vastctl import clock as clocks
from vastctl.demo import day as demo_day
from vastctl.demo import setting
from vastctl.facts import demand
from vastctl.state import db

WIDTH = demand.ARRIVAL_BUCKET_S // 60
EXACT = setting.LOOKAHEAD_MINUTES // WIDTH  # the buckets within the look-ahead


@pytest.mark.parametrize("minute", [0, 17, 600, 655, 960, 1135, 1300, 1439])
def test_the_buckets_are_the_curves_proofs_within_the_look_ahead_and_none_beyond(minute):
    curve = setting.DemandCurve(setting.DEFAULT_SEED)
    buckets = curve.arrivals(minute)
    assert len(buckets) == demand.ARRIVAL_BUCKETS and all(count >= 0 for count in buckets)
    for k in range(EXACT):  # each bucket: the proofs of its 10 minutes, whole (at most one off, where one is split)
        first = minute + 1 + k * WIDTH
        exact = sum(curve.rate(m) for m in range(first, first + WIDTH)) / 60
        assert abs(buckets[k] - exact) < 1, (k, buckets[k], exact)
    assert buckets[EXACT:] == [0] * (demand.ARRIVAL_BUCKETS - EXACT)  # beyond: no sector is precommitted yet
    assert sum(buckets) == math.ceil(curve.coming(minute) - 1e-9)  # they add up to the reported look-ahead
    beyond = range(minute + 1 + setting.LOOKAHEAD_MINUTES, minute + 1 + setting.LOOKAHEAD_MINUTES + 180)
    assert curve.later(minute) == math.ceil(sum(curve.rate(m) for m in beyond) / 60 - 1e-9)


def test_the_quiet_spell_shows_in_the_buckets_before_it_comes():
    curve = setting.DemandCurve(setting.DEFAULT_SEED)
    quiet_from = int(setting.QUIET[0] * 60)
    buckets = curve.arrivals(quiet_from - 25)  # 25 minutes before: two buckets and a half of work, then none
    assert buckets[0] > 0 and buckets[1] > 0 and buckets[3:] == [0] * (demand.ARRIVAL_BUCKETS - 3)


@pytest.mark.slow
def test_a_simulated_days_samples_carry_its_curves_buckets(tmp_path):
    options = setting.DemoOptions(hours=0.5)
    demo_day.run(options, tmp_path)
    conn = db.connect(tmp_path / "demo.db", now=setting.START + timedelta(hours=1))
    curve = setting.DemandCurve(options.seed)
    rows = conn.execute("SELECT at, lookahead, arrivals, later FROM demand_samples WHERE source = 'report'"
                        " ORDER BY id").fetchall()
    assert len(rows) == options.minutes
    for row in rows:
        minute = round((clocks.parse_iso(row["at"]) - setting.START).total_seconds() / 60)
        assert json.loads(row["arrivals"]) == curve.arrivals(minute), minute
        assert row["later"] == curve.later(minute) and row["lookahead"] == sum(curve.arrivals(minute))
    assert demand.current(conn, setting.demo_config(tmp_path, options), now=setting.START + timedelta(minutes=29)
                          ).arrivals == tuple(curve.arrivals(29))
