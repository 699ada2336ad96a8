"""Prices from vast are hostile numbers: NaN, ±Infinity, zero or negative $/h never reach the guard or the file.

The market is a loopback fake (responses) that answers the way a broken vast would; `vastctl offers` and
`vastctl launch` run against it as an operator runs them.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from urllib.parse import urlparse

import pytest
import responses
from helpers.vast_market import configure, offer, rows

from vastctl import guard
from vastctl.clock import VirtualClock
from vastctl.config import Config
from vastctl.facts.demand import Demand
from vastctl.observe import Observation
from vastctl.providers.base import OfferQuery
from vastctl.providers.vast import VastProvider

API = "https://vast.test"
KEY = "price-test-key-4242"
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


@pytest.fixture
def ready(cli, tmp_path, monkeypatch):
    configure(cli, tmp_path, monkeypatch, api=API, key=KEY, max_instances=20, max_hourly_spend=1.0)


@pytest.fixture
def vast():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mocked:
        yield mocked


def answer_offers(vast, *specs):
    """The bundles answer as raw JSON text, so NaN, Infinity and 1e400 go out as vast would write them."""
    text = json.dumps({"offers": [offer(oid, 100 + oid, f"@{oid}@") for oid, _ in specs]})
    for oid, dph in specs:
        text = text.replace(f'"@{oid}@"', dph)
    vast.post(f"{API}/api/v0/bundles/", body=text, content_type="application/json")


def creates(vast):
    return [urlparse(c.request.url).path for c in vast.calls if c.request.method == "PUT"]


def one_error_line(result):
    lines = result.err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.err


BAD_PRICES = ["NaN", "-20", "0", "0.0", "Infinity", "-Infinity", "1e400", '"0.3"', "null", "true"]


@pytest.mark.parametrize("bad", BAD_PRICES)
def test_offers_never_show_an_offer_without_a_real_price(ready, cli, vast, bad):
    answer_offers(vast, (1, bad), (2, "0.31"))
    result = cli("offers", "--json")
    assert result.code == 0, result.err
    shown = json.loads(result.out)
    assert [o["id"] for o in shown] == [2] and shown[0]["dph_total"] == 0.31


def test_nan_offers_rent_nothing(ready, cli, vast, db_path):
    """The incident: three NaN offers, max_hourly_spend 1.0, and launch rented all three (dph stored NULL)."""
    answer_offers(vast, (1, "NaN"), (2, "NaN"), (3, "NaN"))
    result = cli("launch", "--gpu", "RTX 4090", "--count", "3")
    assert result.code == 1 and one_error_line(result) and "no RTX 4090 offer" in result.err
    assert creates(vast) == [] and rows(db_path) == []


def test_a_negative_offer_cannot_make_room_under_the_spend_limit(ready, cli, vast, db_path):
    """The incident: a −20 $/h offer brought spend to $-15.89/h and let five more machines in under $1/h."""
    answer_offers(vast, (1, "-20"), (2, "0.45"), (3, "0.45"), (4, "0.45"))
    vast.put(f"{API}/api/v0/asks/2/", json={"success": True, "new_contract": 9002})
    vast.put(f"{API}/api/v0/asks/3/", json={"success": True, "new_contract": 9003})
    result = cli("launch", "--gpu", "RTX 4090", "--count", "2", "--json")
    assert result.code == 0, result.err
    assert creates(vast) == ["/api/v0/asks/2/", "/api/v0/asks/3/"]
    assert [(r["offer_id"], r["dph"]) for r in rows(db_path)] == [(2, 0.45), (3, 0.45)]
    answer_offers(vast, (1, "-20"), (4, "0.45"))
    again = cli("launch", "--gpu", "RTX 4090", "--count", "1")
    assert again.code == 4 and "max_hourly_spend" in again.err and one_error_line(again)
    assert creates(vast) == ["/api/v0/asks/2/", "/api/v0/asks/3/"] and len(rows(db_path)) == 2


@pytest.mark.parametrize("bad", ["NaN", "-20", "0", "Infinity"])
def test_launch_of_one_offer_without_a_real_price_says_so(ready, cli, vast, db_path, bad):
    answer_offers(vast, (7, bad))
    result = cli("launch", "--offer", "7")
    assert result.code == 1 and one_error_line(result)
    assert "offer 7" in result.err and "price" in result.err and "not renting it" in result.err
    assert creates(vast) == [] and rows(db_path) == []


def test_listing_numbers_that_are_not_figures_are_unknown(vast):
    clock = VirtualClock(NOW)
    provider = VastProvider(KEY, API, clock=clock)
    text = json.dumps({"instances": [
        {"id": 1, "label": "vastctl-a", "actual_status": "running", "dph_total": 0.0, "start_date": 0.0},
        {"id": 2, "label": "vastctl-b", "actual_status": "stopped", "dph_total": 0.5, "dph_base": 0.45},
        {"id": 3, "label": "vastctl-c", "actual_status": "stopped", "dph_total": 0.5, "storage_total_cost": 0.07},
    ]}).replace('"dph_total": 0.0, "start_date": 0.0', '"dph_total": NaN, "start_date": Infinity')
    vast.get(f"{API}/api/v1/instances/", body=text, content_type="application/json")
    first, second, third = provider.list_instances()
    assert (first.dph_total, first.start_date, first.storage_dph) == (None, None, None)
    assert second.dph_total == 0.5 and math.isclose(second.storage_dph, 0.05)
    assert third.storage_dph == 0.07


def test_a_negative_listed_price_is_not_a_price(vast):
    provider = VastProvider(KEY, API, clock=VirtualClock(NOW))
    vast.get(f"{API}/api/v1/instances/", json={"instances": [
        {"id": 1, "label": "vastctl-a", "dph_total": -20, "storage_total_cost": -1}]})
    (only,) = provider.list_instances()
    assert (only.dph_total, only.storage_dph) == (None, None)


def test_search_never_returns_an_unpriced_offer(vast):
    provider = VastProvider(KEY, API, clock=VirtualClock(NOW))
    answer_offers(vast, (1, "NaN"), (2, "-1"), (3, "0.2"), (4, "1e400"), (5, "1e-320"), (6, "0.0001"), (7, "0.001"))
    assert sorted(o.id for o in provider.search_offers(OfferQuery())) == [3, 7]


def observation(spend=0.0):
    return Observation(now=NOW, settings={"max_hourly_spend": 1.0, "max_dph": 1.0, "max_instances": 10},
                       demand=Demand(queued=0, proofs_per_hour=None, at=NOW, age_s=0, source="operator", known=True,
                                     error=None),
                       machines=[], capacity=0.0, pending_capacity=0.0, spend_per_hour=spend, events=[],
                       last_actions=[])


@pytest.mark.parametrize("dph", [math.nan, -20.0, 0.0, math.inf, -math.inf, 1e-320, 0.0009])
def test_the_guard_refuses_a_launch_at_a_price_that_is_not_one(dph):
    action = guard.Action(kind="launch", actor="agent", offer_id=1, gpu_name="RTX 4090", dph=dph)
    verdict = guard.check(observation(), action, Config())
    assert not verdict.allowed and verdict.limit == "max_dph" and "not a price" in verdict.why


def test_a_nan_spend_is_refused_not_passed():
    action = guard.Action(kind="launch", actor="agent", offer_id=1, gpu_name="RTX 4090", dph=0.1)
    verdict = guard.check(observation(spend=math.nan), action, Config())
    assert not verdict.allowed and verdict.limit == "max_hourly_spend"
