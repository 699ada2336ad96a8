"""The narrow interface to a GPU market, and the plain records it speaks in.

Everything above this line (launch, reconcile, the agent) sees only these
types, so the real vast.ai client and the simulated market are interchangeable.
A provider raises ProviderError when it cannot answer; it never turns a failure
into an empty result (an empty listing read as "no machines" kills a fleet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from vastctl.errors import Unavailable


class ProviderError(Unavailable):
    """The market did not answer, or answered something we cannot trust. Exit 1: retry later."""


class ProviderRejected(ProviderError):
    """The market answered and refused the call, so it had no effect (unlike a timeout, whose outcome is unknown)."""


class DeadlinePassed(ProviderError):
    """The caller's time budget ran out: the call, or its next retry, was not made."""


class OfferGone(ProviderRejected):
    """The offer was taken or withdrawn between search and create (vast 404/410 no_such_ask)."""


@dataclass
class RemoteInstance:
    """One machine as the market lists it."""

    id: int
    label: str | None = None
    actual_status: str | None = None
    intended_status: str | None = None
    cur_state: str | None = None
    status_msg: str | None = None
    machine_id: int | None = None
    gpu_name: str | None = None
    num_gpus: int | None = None
    dph_total: float | None = None  # $/h, GPU and disk; None when vast's figure is not a real price
    start_date: float | None = None
    storage_dph: float | None = None  # $/h the disk alone bills (all a stopped instance costs), when vast says
    raw: dict[str, object] = field(default_factory=dict, repr=False)


@dataclass
class Offer:
    """One rentable machine (an "ask") from an offer search."""

    id: int
    machine_id: int | None
    gpu_name: str
    num_gpus: int
    dph_total: float
    cpu_ram_gb: float | None = None
    inet_down_mbps: float | None = None
    reliability: float | None = None
    raw: dict[str, object] = field(default_factory=dict, repr=False)


@dataclass
class OfferQuery:
    gpu_names: list[str] = field(default_factory=list)
    max_dph: float | None = None
    min_cpu_ram_gb: float | None = None
    min_inet_down_mbps: float | None = None
    min_reliability: float | None = None
    disk_gb: float = 150.0
    limit: int = 20
    offer_id: int | None = None  # look up one offer by id (the other filters are then not applied)


@dataclass
class CreateRequest:
    offer_id: int
    image: str
    disk_gb: float
    label: str
    onstart: str
    env: dict[str, str] = field(default_factory=dict)
    price: float | None = None  # a bid in $/h: an interruptible instance; None: on demand at the offer's price


class Provider(Protocol):
    # A monotonic instant on the clock the provider was built with, or None. Past it the provider starts no
    # call and waits for no retry (a Retry-After included): it raises DeadlinePassed. A pass that must end
    # before the next cron tick sets it (reconcile.deadline).
    deadline: float | None

    def list_instances(self) -> list[RemoteInstance]:
        """Every instance of ours (all pages). Raises ProviderError on any failure or partial answer."""

    def show_instance(self, vast_id: int) -> RemoteInstance | None:
        """One instance, or None when the market no longer has it."""

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        """Rentable offers matching the query, cheapest first."""

    def create_instance(self, request: CreateRequest) -> int:
        """Rent an offer; returns the new instance id."""

    def destroy_instance(self, vast_id: int) -> None:
        """Destroy (stops all billing). An instance that is already gone counts as destroyed."""

    def stop_instance(self, vast_id: int) -> None: ...

    def start_instance(self, vast_id: int) -> None: ...
