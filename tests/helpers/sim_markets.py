"""The simulated market on a fresh state file and an injected clock, and the offers on its healthy (or slow) hosts."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from vastctl import launches, reconcile
from vastctl.clock import VirtualClock
from vastctl.config import Config
from vastctl.machine.reports import LocalReports
from vastctl.providers import sim_market
from vastctl.providers.base import OfferQuery
from vastctl.providers.sim import SimProvider
from vastctl.providers.sim_market import FailureRates
from vastctl.state import db, lifecycle, tokens

START = datetime(2031, 3, 1, tzinfo=timezone.utc)  # far from the wall clock: a wall-clock time in the file stands out
QUIET = FailureRates(**{f.name: 0.0 for f in dataclasses.fields(FailureRates)})


@dataclasses.dataclass
class Market:
    conn: object
    config: Config
    clock: VirtualClock
    sim: SimProvider

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def row(self, uuid: str) -> dict:
        return lifecycle.get(self.conn, uuid)

    def launch(self, **kwargs):
        return launches.launch(self.conn, self.sim, self.config, now=self.clock.now(), **kwargs)

    def reconcile(self):
        return reconcile.run_pass(self.conn, self.sim, self.config, clock=self.clock)


def make_market(directory, *, seed: int = 1, failures: str = "default", rates: FailureRates | None = None,
                start: datetime = START) -> Market:
    config = Config(db=str(directory / "sim.db"), provider="sim")
    config.server.url = "https://manager.example"
    config.fleet.max_instances = 40
    config.fleet.max_hourly_spend = 100.0
    config.fleet.gpus = [model.name for model in sim_market.GPUS]  # every model the market offers may be rented
    tokens.ensure_secret(config.secret_path)
    virtual = VirtualClock(start)
    conn = db.connect(config.db_path, create=True, now=virtual.now())
    sim = SimProvider(conn, lambda at: LocalReports(conn, config, now=at), clock=virtual, seed=seed,
                      failures=failures, rates=rates)
    return Market(conn, config, virtual, sim)


def healthy_offer(market: Market, *, slow: bool = False):
    """The cheapest offer on a host that proves at its model's rate (or, with `slow`, below the gate)."""
    hosts = {host.offer_id: host for host in market.sim.hosts()}
    offers = market.sim.search_offers(OfferQuery(min_cpu_ram_gb=256, min_inet_down_mbps=500, limit=500))
    for offer in offers:
        host = hosts[offer.id]
        if (host.true_rate < 40) if slow else (not host.slow and host.true_rate >= 60 and offer.dph_total <= 1.0):
            return offer
    raise AssertionError("no such offer in this market")
