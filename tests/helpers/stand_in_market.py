"""The provider interface in memory, for agent-step, launch and the guard at the command line: offers to rent,
and every call recorded; nothing leaves the process."""

from __future__ import annotations

from vastctl.providers.base import Offer, RemoteInstance


class Market:
    """Eight RTX 4090 offers (ids 1–8, machine ids 10–80) at `dph(id)` $/h; the cheapest first by default."""

    def __init__(self, dph=lambda i: 0.3 + i / 100):
        self.offers = [Offer(id=i, machine_id=i * 10, gpu_name="RTX 4090", num_gpus=1, dph_total=dph(i),
                             cpu_ram_gb=512, inet_down_mbps=900, reliability=0.99) for i in range(1, 9)]
        self.calls: list[tuple] = []
        self.next_id = 9000

    def search_offers(self, query):
        self.calls.append(("search", query.offer_id))
        if query.offer_id is not None:
            return [o for o in self.offers if o.id == query.offer_id]
        return [o for o in self.offers if query.max_dph is None or o.dph_total <= query.max_dph][: query.limit]

    def create_instance(self, request):
        self.next_id += 1
        self.calls.append(("create", request.offer_id))
        return self.next_id

    def list_instances(self):
        return [RemoteInstance(id=9000)]

    def stop_instance(self, vast_id):
        self.calls.append(("stop", vast_id))

    def start_instance(self, vast_id):
        self.calls.append(("start", vast_id))

    def destroy_instance(self, vast_id):
        self.calls.append(("destroy", vast_id))


def stand_in(monkeypatch, fake: Market) -> Market:
    """Every command that reaches the provider (through markets.get_provider, the one way) reaches `fake` instead."""
    monkeypatch.setattr("vastctl.markets.get_provider", lambda config, *, clock: fake)
    return fake
