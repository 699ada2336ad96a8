"""Interruptible (bid) machines at vast: the create carries `price`, a bid vast dropped is noticed, change-bid is
the call the official CLI makes, and an outbid machine is waited for, not killed. Against a loopback fake of the
vast API (a real HTTP server on 127.0.0.1, port 0) and reconcile's plan over what it lists."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from http.server import ThreadingHTTPServer

import pytest
from helpers.serving import JsonHandler, on_a_thread

from vastctl import bids, clock, guard, validate
from vastctl.agent import sizing
from vastctl.config import from_mapping
from vastctl.demo import day, setting
from vastctl.errors import BadInput
from vastctl.providers.base import CreateRequest, Offer, ProviderRejected
from vastctl.providers.vast import VastProvider
from vastctl.reconcile import plan

KEY = "fake-key-0123456789"
NOW = datetime(2031, 3, 3, 12, 0, tzinfo=timezone.utc)


class FakeVast(ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict]] = []
        self.instances: dict[int, dict] = {}
        self.drop_bids = False  # answer a bid create with an on-demand instance (vast-cli PR #403)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(JsonHandler):
    server: FakeVast

    def _take(self, method: str) -> tuple[str, dict]:
        body = self.read_json()
        path = self.path.split("?")[0]
        with self.server.lock:
            self.server.requests.append((method, path, body))
        return path, body

    def do_PUT(self):
        path, body = self._take("PUT")
        if path.startswith("/api/v0/asks/"):
            with self.server.lock:
                vast_id = 500 + len(self.server.instances)
                bid = body.get("price") is not None and not self.server.drop_bids
                self.server.instances[vast_id] = {
                    "id": vast_id, "label": body["label"], "actual_status": "running", "intended_status": "running",
                    "cur_state": "running", "machine_id": 9001, "gpu_name": "RTX 4090", "num_gpus": 1,
                    "dph_total": body["price"] if bid else 0.45, "is_bid": bid}
            self.send_json(200, {"success": True, "new_contract": vast_id})
        elif path.startswith("/api/v0/instances/bid_price/"):
            vast_id = int(path.rstrip("/").rsplit("/", 1)[-1])
            if vast_id not in self.server.instances:
                self.send_json(404, {"success": False, "error": "no_such_instance"})
            else:
                self.send_json(200, {"success": True})
        else:
            self.send_json(404, {"success": False, "error": "not_found"})

    def do_GET(self):
        path, _ = self._take("GET")
        with self.server.lock:
            rows = list(self.server.instances.values())
        if path.startswith("/api/v1/instances/"):
            self.send_json(200, {"success": True, "instances": rows, "next_token": None, "total_instances": len(rows)})
        elif path.startswith("/api/v0/instances/"):
            vast_id = int(path.rstrip("/").rsplit("/", 1)[-1])
            self.send_json(200, {"instances": self.server.instances.get(vast_id)})
        else:
            self.send_json(404, {"success": False, "error": "not_found"})

    def do_DELETE(self):
        path, _ = self._take("DELETE")
        vast_id = int(path.rstrip("/").rsplit("/", 1)[-1])
        with self.server.lock:
            self.server.instances.pop(vast_id, None)
        self.send_json(200, {"success": True})


@pytest.fixture
def fake():
    with on_a_thread(FakeVast()) as server:
        yield server


def provider(fake: FakeVast) -> VastProvider:
    return VastProvider(KEY, fake.url, attempts=1, backoff_s=0, clock=clock.VirtualClock(NOW))


def request(price=None) -> CreateRequest:
    return CreateRequest(offer_id=77, image="nvidia/cuda", disk_gb=150, label="vastctl-bid-1", onstart="true",
                         price=price)


@pytest.mark.slow
def test_an_interruptible_create_carries_its_bid_as_price_and_on_demand_carries_none(fake):
    vast = provider(fake)
    bid_id = vast.create_instance(request(price=0.1234567))
    on_demand = vast.create_instance(request())
    creates = [body for method, path, body in fake.requests if path == "/api/v0/asks/77/"]
    assert [c["price"] for c in creates] == [0.1235, None]
    assert fake.instances[bid_id]["is_bid"] is True and fake.instances[on_demand]["is_bid"] is False
    # the bid was checked at vast after the create (the answer does not say what was created)
    assert ("GET", f"/api/v0/instances/{bid_id}/", {}) in fake.requests


@pytest.mark.slow
def test_a_create_that_came_back_on_demand_when_a_bid_was_asked_is_noticed_and_destroyed(fake):
    fake.drop_bids = True
    with pytest.raises(ProviderRejected, match=r"on demand although a bid of \$0.12/h was asked; destroyed it"):
        provider(fake).create_instance(request(price=0.12))
    assert fake.instances == {}  # nothing bills at a price that was not asked
    assert [m for m, p, _ in fake.requests if p.startswith("/api/v0/instances/5")] == ["GET", "DELETE"]


@pytest.mark.slow
def test_change_bid_is_the_call_the_official_cli_makes(fake):
    vast = provider(fake)
    vast_id = vast.create_instance(request(price=0.12))
    vast.change_bid(vast_id, 0.2)
    assert fake.requests[-1] == ("PUT", f"/api/v0/instances/bid_price/{vast_id}/", {"client_id": "me", "price": 0.2})
    with pytest.raises(ProviderRejected, match="no such instance"):
        vast.change_bid(999, 0.2)
    for bad in (0.0, -1, 33.0, float("nan"), True, "0.2"):
        with pytest.raises(BadInput):
            vast.change_bid(vast_id, bad)
    assert fake.requests[-1][1] == "/api/v0/instances/bid_price/999/"  # the bad bids never went out


def running_row(vast_id: int, label: str, heartbeat_min_ago: float) -> dict:
    beat = clock.to_iso(NOW - timedelta(minutes=heartbeat_min_ago))
    return {"uuid": f"u-{label}", "label": label, "state": "running", "vast_id": vast_id, "machine_id": 9001,
            "bench_rate": 80.0, "state_since": clock.to_iso(NOW - timedelta(hours=3)), "last_heartbeat_at": beat,
            "vast_status": "stopped", "vast_status_msg": None, "vast_seen_at": clock.to_iso(NOW - timedelta(minutes=1)),
            "vast_missing": 0, "resumed_at": None, "destroyed_at": None, "killed_at": None, "kill_code": None,
            "kill_reason": None, "destroy_attempts": 0, "destroy_error": None, "proofs_done": 40}


@pytest.mark.slow
def test_an_outbid_listing_is_waited_for_by_reconcile_not_killed(fake):
    vast = provider(fake)
    paused = vast.create_instance(request(price=0.12))
    long_gone = vast.create_instance(CreateRequest(offer_id=77, image="x", disk_gb=150, label="vastctl-bid-2",
                                                   onstart="true", price=0.12))
    for vast_id in (paused, long_gone):  # vast stops them for a higher bid; they stay listed
        fake.instances[vast_id].update(actual_status="stopped", cur_state="stopped", intended_status="stopped")
    listing = vast.list_instances()
    rows = [running_row(paused, "vastctl-bid-1", heartbeat_min_ago=30),
            running_row(long_gone, "vastctl-bid-2", heartbeat_min_ago=3 * 60)]
    actions = plan(rows, listing, {"min_bench_rate": 40.0}, from_mapping({}), NOW)
    killed = {(a.label, a.code) for a in actions if a.kind == "kill"}
    # paused 30 min without a heartbeat (past timeouts.heartbeat): waited for; past the grace it is timed out
    assert killed == {("vastctl-bid-2", "heartbeat_timeout")}


def test_an_outbid_machine_is_not_counted_as_capacity():
    machine = {"uuid": "u-a", "label": "vastctl-a", "state": "running", "expected_rate": 80.0, "dph": 0.2,
               "vast_id": 1, "vast_status": "stopped", "vast_missing": 0}
    proving = dict(machine, uuid="u-b", label="vastctl-b", vast_status="running")
    from vastctl.facts.demand import Demand
    from vastctl.observe import Observation
    obs = Observation(now=NOW, settings={}, demand=Demand(queued=5, proofs_per_hour=None, at=NOW, age_s=0,
                                                          source="report", known=True),
                      machines=[machine, proving], capacity=160, pending_capacity=0, spend_per_hour=0.4, events=[],
                      last_actions=[])
    assert sizing.counted_capacity(obs) == 80.0


@pytest.mark.parametrize("min_bid, dph, max_dph, expected", [
    (0.10, 0.45, 1.0, 0.11),  # min_bid plus 10%
    (0.95, 1.20, 1.0, 1.0),  # never above max_dph
    (0.40, 0.42, 1.0, 0.42),  # nor above the on-demand price
    (1.10, 1.50, 1.0, None),  # the floor itself past max_dph: no bid
    (None, 0.45, 1.0, None), (float("nan"), 0.45, 1.0, None), (0, 0.45, 1.0, None), (-0.1, 0.45, 1.0, None),
    (True, 0.45, 1.0, None), ("0.1", 0.45, 1.0, None),  # vast's numbers are hostile
])
def test_a_bid_is_min_bid_plus_a_margin_and_never_above_max_dph(min_bid, dph, max_dph, expected):
    offer = Offer(id=1, machine_id=1, gpu_name="RTX 4090", num_gpus=1, dph_total=dph, raw={"min_bid": min_bid})
    bid = bids.bid_for_offer(offer, max_dph)
    assert bid == (None if expected is None else pytest.approx(expected))
    if bid is not None:
        assert bid <= max_dph


# --- which launches bid (launch.rental) ---------------------------------------------------------------


@pytest.mark.parametrize("rental, share, live_bids, expected", [
    ("on-demand", 0.5, [None, 0.2], False),
    ("interruptible", 0.5, [0.2, 0.2, 0.2], True),
    ("mixed", 0.5, [], False),  # the first machine of a fleet is on demand
    ("mixed", 0.5, [None], True),  # 1 of 2 bidding
    ("mixed", 0.5, [None, 0.2], False),  # 2 of 3 would be over half
    ("mixed", 0.5, [None, 0.2, None], True),
    ("mixed", 0.0, [None, None, None], False),
    ("mixed", 1.0, [0.2], True),
])
def test_launch_rental_decides_which_launches_bid(rental, share, live_bids, expected):
    config = from_mapping({"launch": {"rental": rental, "interruptible_share": share}})
    live = [{"bid": bid} for bid in live_bids]
    assert bids.wants_bid(config, live) is expected
    offer = Offer(id=1, machine_id=1, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45, raw={"min_bid": 0.2})
    assert bids.launch_bid(config, offer, 1.0, live) == (pytest.approx(0.22) if expected else None)
    unpriced = Offer(id=2, machine_id=2, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45, raw={})
    assert bids.launch_bid(config, unpriced, 1.0, live) is None  # no usable min_bid: rented on demand


@pytest.mark.parametrize("mapping, error", [
    ({"launch": {"rental": "bid"}}, "launch.rental' must be one of on-demand, interruptible, mixed"),
    ({"launch": {"interruptible_share": 1.5}}, "launch.interruptible_share' must be from 0 to 1"),
    ({"launch": {"bid_margin": 1.5}}, "launch.bid_margin' must be from 0 to 1"),
])
def test_bad_rental_keys_are_refused_naming_the_key(mapping, error):
    with pytest.raises(BadInput, match=error.replace("(", r"\(")):
        from_mapping(mapping)


# --- a rebid goes through the guard -------------------------------------------------------------------


def _rebid_obs(machine, spend=0.4, max_dph=0.5, max_spend=10.0):
    from vastctl.facts.demand import Demand
    from vastctl.observe import Observation
    return Observation(now=NOW, settings={"max_dph": max_dph, "max_hourly_spend": max_spend, "max_instances": 10,
                                          "target_proofs_per_hour": 100, "min_bench_rate": 40},
                       demand=Demand(queued=5, proofs_per_hour=None, at=NOW, age_s=0, source="report", known=True),
                       machines=[machine], capacity=0, pending_capacity=0, spend_per_hour=spend, events=[],
                       last_actions=[])


@pytest.mark.parametrize("bid, new, max_dph, max_spend, allowed, limit", [
    (0.2, 0.25, 0.5, 10.0, True, None),
    (0.2, 0.6, 0.5, 10.0, False, "max_dph"),  # never above max_dph
    (0.2, 0.45, 0.5, 0.4, False, "max_hourly_spend"),  # 0.2 spent + 0.25 more > 0.4  # the rise counts against the spend
    (None, 0.25, 0.5, 10.0, False, "rebid"),  # an on-demand machine has no bid
])
def test_the_guard_keeps_a_rebid_within_max_dph_and_the_spend(bid, new, max_dph, max_spend, allowed, limit):
    machine = {"uuid": "u-a", "label": "vastctl-a", "state": "running", "expected_rate": 80.0, "dph": 0.2,
               "bid": bid, "vast_id": 1, "vast_status": "stopped", "vast_missing": 0}
    action = guard.Action(kind=guard.Kind.REBID, actor="agent", label="vastctl-a", uuid="u-a", dph=new,
                          reason="outbid")
    verdict = guard.check(_rebid_obs(machine, spend=0.2, max_dph=max_dph, max_spend=max_spend), action,
                          from_mapping({}))
    assert verdict.allowed is allowed and verdict.limit == limit, verdict.why


# --- a mixed fleet over a simulated day ---------------------------------------------------------------


@pytest.mark.slow
def test_a_mixed_fleet_over_a_simulated_day_bids_is_outbid_and_keeps_the_service(tmp_path):
    def mixed(config):
        config.launch.rental = "mixed"

    result = day.run(setting.DemoOptions(hours=12, seed=2, failures="default"), tmp_path, configure=mixed)
    figures = result.figures
    assert figures["rental"] == "mixed"
    assert 0 < figures["machines_interruptible"] < figures["machines_launched"]
    assert figures["outbids"] > 0
    assert figures["proofs_within_max_wait"] >= 0.99
    assert figures["lower_bound_interruptible_cost_per_1000_proofs"] < figures["lower_bound_cost_per_1000_proofs"]
    import sqlite3
    conn = sqlite3.connect(tmp_path / "demo.db")
    outbid = {row[0] for row in conn.execute("SELECT vast_id FROM sim_faults WHERE kind = 'outbid'")}
    kills = {row[0]: row[1] for row in conn.execute("SELECT vast_id, kill_code FROM instances WHERE state = 'killed'")}
    # a paused machine is waited for, rebid or released by the agent: never timed out as dead
    assert not {kills[v] for v in outbid if v in kills} - {"agent"}, kills


# --- bid_for_offer as a function of the offer alone: every refusal and bound (quick) ----------------------


def bid_offer(min_bid=0.2, dph=0.45, raw="auto") -> Offer:
    return Offer(id=1, machine_id=1, gpu_name="RTX 4090", num_gpus=1, dph_total=dph,
                 raw={"min_bid": min_bid} if raw == "auto" else raw)


def test_the_bid_is_the_floor_plus_the_margin_rounded_to_four_places():
    assert bids.bid_for_offer(bid_offer(0.2), 1.0) == 0.22
    assert bids.bid_for_offer(bid_offer(0.2), 1.0, margin=0.5) == 0.3
    assert bids.bid_for_offer(bid_offer(0.11111), 1.0) == 0.1222  # 0.122221
    assert bids.bid_for_offer(bid_offer(1, dph=3.0), 2.0, margin=0) == 1.0  # an integer floor counts as its price


def test_the_bid_never_passes_max_dph_nor_the_on_demand_price():
    assert bids.bid_for_offer(bid_offer(0.28, dph=0.45), 0.3) == 0.3  # 0.308 past max_dph
    assert bids.bid_for_offer(bid_offer(0.24, dph=0.25), 1.0) == 0.25  # 0.264 past the offer's own price
    assert bids.bid_for_offer(bid_offer(0.3, dph=0.45), 0.3) == 0.3  # a floor at max_dph is still a bid
    assert bids.bid_for_offer(bid_offer(0.31, dph=0.45), 0.3) is None  # the floor itself past max_dph
    assert bids.bid_for_offer(bid_offer(0.5, dph=0.45), 1.0) is None  # past the on-demand price


@pytest.mark.parametrize("raw", [{}, {"min_bid": None}, {"min_bid": True}, {"min_bid": "0.2"}, {"min_bid": float("nan")},
                                 {"min_bid": float("inf")}, {"min_bid": 0}, {"min_bid": -0.2}, {"min_bid": 1e-320},
                                 {"min_bid": validate.MIN_DPH / 2}, None, ["min_bid", 0.2]])
def test_an_offer_naming_no_usable_min_bid_gets_no_bid(raw):
    assert bids.bid_for_offer(bid_offer(raw=raw), 1.0) is None


def test_a_floor_at_the_smallest_price_is_a_bid():
    assert bids.bid_for_offer(bid_offer(validate.MIN_DPH), 1.0, margin=0) == validate.MIN_DPH


def test_a_launch_bids_with_the_configured_margin():
    config = from_mapping({"launch": {"rental": "interruptible", "bid_margin": 0.5}})
    assert bids.launch_bid(config, bid_offer(0.2), 1.0, []) == 0.3
    assert bids.launch_bid(from_mapping({"launch": {"rental": "on-demand", "bid_margin": 0.5}}), bid_offer(0.2), 1.0,
                           []) is None
