"""`events` in id order is also time order: a reconcile pass whose listing is slow stamps its events as of the
listing, after the machines' reports written while it waited."""

from __future__ import annotations

from test_reconcile_apply import NOW, FakeMarket, at, make

from vastctl import clock, reconcile
from vastctl.views import fleet


class SlowMarket(FakeMarket):
    """vast answers the listing after 6 s, during which a machine's report (here an operator's note) lands."""

    def __init__(self, conn, virtual: clock.VirtualClock):
        super().__init__()
        self.conn, self.clock = conn, virtual

    def list_instances(self):
        self.clock.advance(6)
        fleet.notify(self.conn, "written while vast was answering", now=self.clock.now())
        return super().list_instances()


def test_a_slow_listing_never_makes_event_times_run_backwards(conn, config):
    make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-14)))
    virtual = clock.VirtualClock(NOW)
    market = SlowMarket(conn, virtual)
    market.add(11, "vastctl-a")
    result = reconcile.run_pass(conn, market, config, clock=virtual)
    assert [a["kind"] for a in result.actions] == ["kill", "destroy"]
    shown = fleet.events(conn, limit=50)
    kinds = [(e["kind"], e["source"]) for e in shown][-2:]
    assert kinds == [("note", "operator"), ("transition", "reconcile")]  # the note first, then the kill
    times = [e["at"] for e in shown]
    assert times == sorted(times), times
