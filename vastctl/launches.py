"""Renting machines: the offers searched, the guard passed, each machine's row and audit written before its create.

launch rents machines (the row and a pending audit entry are committed before
the create call and completed after, so a crash at any point is recovered by
label and the audit says a purchase may have happened). What happens to a machine once rented (stop, start,
rebid, kill, destroy) is operations.py's, whose guard and destroy a launch uses.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from typing import Any, Mapping

from vastctl import bids, clock, guard, identities, upstream, validate
from vastctl.config import Config
from vastctl.errors import BadInput, GuardRefused, Unavailable, VastctlError
from vastctl.facts import tunnel
from vastctl.guard import Kind
from vastctl.machine import onstart
from vastctl.operations import asked, destroy, mark, pass_guard
from vastctl.providers.base import (
    CreateRequest,
    DeadlinePassed,
    Offer,
    OfferGone,
    OfferQuery,
    Provider,
    ProviderError,
    ProviderRejected,
)
from vastctl.state import blocklist, instances, lifecycle, locks, settings, tokens
from vastctl.state.audit import begin_action, finish_action, settle
from vastctl.state.db import transaction
from vastctl.state.lifecycle import Cause, KillCode, State
from vastctl.state.rows import InstanceChanges, InstanceRow, JSONValue
from vastctl.validate import Invalid

DEFAULT_MIN_RELIABILITY = 0.95  # vast's reliability score; below it machines drop out too often
LAUNCH_LOCK_TTL_S = 15 * 60
SEARCH_SLACK = 10  # extra offers fetched per launch, to skip blocklisted or vanished ones
BLOCKLIST = "blocklist"  # the limit a refusal names when the offer's machine is blocklisted
PUBLIC_ENV = ("VASTCTL_UUID", "VASTCTL_LABEL", "VASTCTL_SERVER", *tunnel.PUBLIC_ENV)  # env values the audit may show


# --- offers -----------------------------------------------------------------------------------------


def offer_query(conn: sqlite3.Connection, config: Config, *, gpu_names: list[str] | None = None,
                max_dph: float | None = None, min_reliability: float | None = None, limit: int = 20) -> OfferQuery:
    """What we would rent: the config's GPU models, RAM and bandwidth floors, and the max_dph setting."""
    if limit < 1:
        raise Invalid("limit", f"must be at least 1, got {limit}")
    for name, value in (("max_dph", max_dph), ("min_reliability", min_reliability)):
        if value is not None:
            validate.finite(value, name)
    if max_dph is None:
        max_dph = float(settings.get(conn, config, "max_dph"))
    return OfferQuery(
        gpu_names=list(gpu_names or config.fleet.gpus), max_dph=max_dph,
        min_cpu_ram_gb=config.fleet.min_cpu_ram_gb, min_inet_down_mbps=config.fleet.min_inet_down_mbps,
        min_reliability=DEFAULT_MIN_RELIABILITY if min_reliability is None else min_reliability,
        disk_gb=config.launch.disk_gb, limit=limit,
    )


def find_offers(conn: sqlite3.Connection, provider: Provider, config: Config, *,
                gpu_names: list[str] | None = None, max_dph: float | None = None,
                min_reliability: float | None = None, limit: int = 20, now: datetime) -> list[Offer]:
    """Rentable offers, cheapest first, without blocklisted machines (see offer_query for the filters)."""
    query = offer_query(conn, config, gpu_names=gpu_names, max_dph=max_dph, min_reliability=min_reliability,
                        limit=limit)
    blocklist.refresh(conn, config.vast.blocklist_ttl, now)
    blocked = blocklist.blocked(conn, now)
    query.limit = limit + min(len(blocked), 100)
    offers = [offer for offer in provider.search_offers(query) if offer.machine_id not in blocked]
    return offers[:limit]


def offer_view(offer: Offer) -> dict[str, Any]:
    return {"id": offer.id, "machine_id": offer.machine_id, "gpu_name": offer.gpu_name, "num_gpus": offer.num_gpus,
            "dph_total": offer.dph_total, "cpu_ram_gb": offer.cpu_ram_gb, "inet_down_mbps": offer.inet_down_mbps,
            "reliability": offer.reliability}


# --- launch -----------------------------------------------------------------------------------------


@dataclass
class LaunchResult:
    """What a launch did. `error` says why fewer than `wanted` machines were rented."""

    wanted: int
    launched: list[InstanceRow] = field(default_factory=list)  # rows, with their vast ids
    failed: list[dict[str, Any]] = field(default_factory=list)  # create refused: row killed, nothing rented
    unknown: list[dict[str, Any]] = field(default_factory=list)  # create outcome unknown: row left launching
    error: str | None = None

    def view(self) -> dict[str, Any]:
        keep = ("uuid", "label", "state", "vast_id", "offer_id", "machine_id", "gpu_name", "num_gpus", "dph")
        return {"launched": [{k: row.get(k) for k in keep} for row in self.launched], "failed": self.failed,
                "unknown": self.unknown, "error": self.error}


class LaunchStatus(Enum):
    """How one machine's create ended."""

    LAUNCHED = "launched"  # the market rented it: the row has its vast id
    NOT_SENT = "not sent"  # the deadline passed before the create went out: nothing rented
    REFUSED = "refused"  # the market refused the create: nothing rented
    OFFER_GONE = "offer gone"  # the offer was taken or withdrawn meanwhile: nothing rented, the next offer may serve
    UNKNOWN = "unknown"  # no answer to the create: the row stays launching for reconcile to find by label


NOTHING_RENTED = frozenset({LaunchStatus.NOT_SENT, LaunchStatus.REFUSED, LaunchStatus.OFFER_GONE})


@dataclass(frozen=True)
class LaunchOutcome:
    """One machine's create: how it ended, the row as it is now, and the market's words (masked)."""

    status: LaunchStatus
    row: InstanceRow
    said: str = ""

    @property
    def why(self) -> str:
        """The reason a launch result lists for a machine not rented; an offer gone says so first."""
        return f"gone: {self.said}" if self.status is LaunchStatus.OFFER_GONE else self.said


def check_launch_request(config: Config, *, offer_id: int | None, gpu: str | None, count: int) -> None:
    """The launch's own arguments and settings, checked before any key, lease or market is needed."""
    if (offer_id is None) == (gpu is None) or (gpu is not None and not gpu.strip()):
        raise BadInput("give exactly one of --offer ID or --gpu NAME")
    if count < 1:
        raise BadInput(f"--count must be at least 1, got {count}")
    if offer_id is not None and count != 1:
        raise BadInput("--offer rents that one offer: use --count 1, or --gpu NAME --count N")
    if config.provider == "sim":  # simulated machines boot in the simulator and report straight into the file
        return
    if not config.server.url:
        raise BadInput("server.url is not set in the config: launched machines would have nowhere to report")
    onstart.check_boot(config.launch)  # a machine that cannot boot is refused before money is spent
    if tunnel.enabled(config):
        tunnel.check_config(config)


def launch(conn: sqlite3.Connection, provider: Provider, config: Config, *, offer_id: int | None = None,
           gpu: str | None = None, count: int = 1, actor: str = "operator", cause: Cause | None = None,
           now: datetime) -> LaunchResult:
    """Rent `count` machines: the offer `offer_id`, or the cheapest offers of model `gpu`.

    One launch at a time (the `launch` lease). Limits (max_instances, max_dph,
    max_hourly_spend, the blocklist) are checked before anything is written:
    a refusal raises GuardRefused and changes nothing. Each machine's row is
    written (state launching) before its create call. A create the market
    refuses kills the row (code start_failed) and marks it destroyed; a
    create whose outcome is unknown leaves the row launching for reconcile to
    find by label, and stops the launch (never two machines for one intent). Each machine's events keep
    `cause` (the agent's reason and step; else the actor's `vastctl launch`) in their data.
    """
    check_launch_request(config, offer_id=offer_id, gpu=gpu, count=count)
    secret = tokens.read_secret(config.secret_path)
    with locks.held(conn, "launch", ttl_s=LAUNCH_LOCK_TTL_S, now=now):
        intent = guard.Action(kind=Kind.LAUNCH, actor=actor, count=count, gpu_name=gpu, offer_id=offer_id,
                              reason=f"launch by {actor}")
        pass_guard(conn, config, intent, now=now)
        max_dph = float(settings.get(conn, config, "max_dph"))
        if offer_id is not None:
            candidates = [_the_offer(conn, provider, config, offer_id, now)]
        else:
            assert gpu is not None  # check_launch_request: an offer id or a GPU model
            candidates = _distinct_machines(find_offers(conn, provider, config, gpu_names=[gpu],
                                                        max_dph=max_dph, limit=count + SEARCH_SLACK, now=now))
            if not candidates:
                raise Unavailable(f"no {gpu} offer at or under ${max_dph:g}/h with ≥"
                                  f"{config.fleet.min_cpu_ram_gb:g} GB RAM and ≥{config.fleet.min_inet_down_mbps:g}"
                                  f" Mb/s down: see `vastctl offers --gpu '{gpu}'`, or retry later")
        chosen = candidates[:count]
        pass_guard(conn, config, replace(intent, count=len(chosen), gpu_name=chosen[0].gpu_name,
                                         dph=sum(offer.dph_total for offer in chosen) / len(chosen)), now=now)
        return _launch_each(conn, provider, config, candidates, count, secret, actor=actor,
                            cause=asked(actor, "launch", cause), retry_gone=offer_id is None, now=now)


def _the_offer(conn: sqlite3.Connection, provider: Provider, config: Config, offer_id: int, now: datetime) -> Offer:
    found = provider.search_offers(OfferQuery(offer_id=offer_id, disk_gb=config.launch.disk_gb, limit=1))
    offer = next((offer for offer in found if offer.id == offer_id), None)
    if offer is None:
        raise BadInput(f"offer {offer_id} is not available (rented or withdrawn): see `vastctl offers`")
    blocklist.refresh(conn, config.vast.blocklist_ttl, now)
    in_force = blocklist.blocked(conn, now)
    entry = in_force.get(offer.machine_id) if offer.machine_id is not None else None
    if entry:
        raise GuardRefused(f"machine {offer.machine_id} of offer {offer_id} is blocklisted until"
                           f" {clock.display_iso(entry['until'])}: {entry['reason']}", limit=BLOCKLIST)
    return offer


def _distinct_machines(offers: list[Offer]) -> list[Offer]:
    seen: set[int | None] = set()
    kept = []
    for offer in offers:
        if offer.machine_id is not None and offer.machine_id in seen:
            continue
        seen.add(offer.machine_id)
        kept.append(offer)
    return kept


def _launch_each(conn: sqlite3.Connection, provider: Provider, config: Config, candidates: list[Offer], count: int,
                 secret: bytes, *, actor: str, cause: Cause, retry_gone: bool, now: datetime) -> LaunchResult:
    result = LaunchResult(wanted=count)
    script = onstart.script_for(config.launch.onstart)
    offers = iter(candidates)
    while len(result.launched) < count:
        offer = next(offers, None)
        if offer is None:
            result.error = f"launched {len(result.launched)} of {count}: no more matching offers"
            break
        try:  # each machine against the fleet as it is now, the ones just rented included
            pass_guard(conn, config, guard.Action(kind=Kind.LAUNCH, actor=actor, gpu_name=offer.gpu_name,
                                                  offer_id=offer.id, dph=offer.dph_total,
                                                  reason=f"launch by {actor}"), now=now)
        except GuardRefused as exc:
            if not result.launched:  # nothing rented: the launch as a whole was refused, and names its limit
                raise
            result.error = f"launched {len(result.launched)} of {count}: {exc}"
            break
        outcome = _launch_one(conn, provider, config, offer, script, secret, actor=actor, cause=cause, now=now)
        row, why = outcome.row, outcome.why
        if outcome.status is LaunchStatus.LAUNCHED:
            result.launched.append(row)
            continue
        entry = {"label": row["label"], "uuid": row["uuid"], "offer_id": offer.id, "reason": why}
        if outcome.status in NOTHING_RENTED:
            result.failed.append(entry)
            if retry_gone and outcome.status is LaunchStatus.OFFER_GONE:
                continue  # nothing was rented: the next cheapest offer serves the same intent
            result.error = f"launched {len(result.launched)} of {count}: vast refused offer {offer.id}: {why}"
        else:
            result.unknown.append(entry)
            result.error = (f"launched {len(result.launched)} of {count}: the create for {row['label']} on offer"
                            f" {offer.id} has an unknown outcome ({why}); reconcile will find it by label")
        break
    return result


def _launch_one(conn: sqlite3.Connection, provider: Provider, config: Config, offer: Offer, script: str, secret: bytes, *, actor: str,
                cause: Cause, now: datetime) -> LaunchOutcome:
    """Write the row and the audit's intent, then rent, then record the outcome.

    Both writes are committed before the create goes out: a crash or a kill -9 at any later point leaves a
    launching row and a `pending` launch in the audit under the label vast knows the machine by (reconcile
    finds it); when the intent cannot be written (a full disk), no create is sent.
    """
    uuid, label = _new_identity(conn, config.vast.label_prefix)
    join_env, join_fields = _join(conn, config, label)
    live = [{"bid": bid} for bid in instances.rented_bids(conn)]
    bid = bids.launch_bid(config, offer, float(settings.get(conn, config, "max_dph")), live)
    rental = f"interruptible, bid ${bid:g}/h" if bid is not None else f"${offer.dph_total:g}/h"
    row = lifecycle.create(
        conn, uuid=uuid, label=label, state=State.LAUNCHING, source=actor, now=now,
        reason=f"launching on offer {offer.id} ({offer.num_gpus}x {offer.gpu_name}, {rental})", cause=cause,
        fields={"offer_id": offer.id, "machine_id": offer.machine_id, "gpu_name": offer.gpu_name,
                "num_gpus": offer.num_gpus, "dph": offer.dph_total if bid is None else bid, "bid": bid,
                "ask_dph": offer.dph_total if bid is not None else None,
                **join_fields},
    )
    if join_fields:  # the machine's key works from its first connect, before the create is even answered
        try:
            tunnel.write_authorized_keys(conn, config)
        except Unavailable as exc:  # nothing rented yet: the row ends here, and so does the launch
            _not_rented(conn, uuid, f"not rented: {exc}", actor, cause, now)
            raise
    env = {**onstart.boot_env(config.launch), **config.launch.env, **join_env, "VASTCTL_UUID": uuid,
           "VASTCTL_LABEL": label, "VASTCTL_TOKEN": tokens.machine_token(secret, uuid),
           "VASTCTL_SERVER": config.server.url}
    request = CreateRequest(offer_id=offer.id, image=config.launch.image, disk_gb=config.launch.disk_gb,
                            label=label, onstart=script, env=env, price=bid)
    audit: dict[str, JSONValue] = {
        "offer_id": offer.id, "image": request.image, "disk_gb": request.disk_gb, "label": label, "price": bid,
        "onstart_chars": len(script), "env": {k: (v if k in PUBLIC_ENV else "***") for k, v in env.items()}}
    try:
        intent = begin_action(conn, actor=actor, kind=Kind.LAUNCH, uuid=uuid, label=label, request=audit, now=now,
                              what=f"create on offer {offer.id} sent; if this stays pending, vast may have rented"
                                   f" a machine labelled {label}: reconcile finds it by that label")
    except BaseException:
        with contextlib.suppress(Exception):  # on a full disk this fails too: reconcile times the row out
            _not_rented(conn, uuid, "the launch's audit row could not be written, so no create was sent", actor,
                        cause, now)
        raise
    try:
        vast_id = provider.create_instance(request)
    except DeadlinePassed as exc:  # raised before anything was sent: nothing was rented
        finish_action(conn, intent, ok=False, result=f"not sent: {exc}")
        _not_rented(conn, uuid, f"the create was not sent: {exc}", actor, cause, now)
        if join_fields:
            tunnel.write_authorized_keys(conn, config)
        return LaunchOutcome(LaunchStatus.NOT_SENT, lifecycle.get(conn, uuid), str(exc))
    except ProviderRejected as exc:
        said = _masked(exc, env)
        finish_action(conn, intent, ok=False, result=f"refused: {said}")
        _not_rented(conn, uuid, f"vast refused the create: {said}", actor, cause, now)
        if join_fields:
            tunnel.write_authorized_keys(conn, config)
        status = LaunchStatus.OFFER_GONE if isinstance(exc, OfferGone) else LaunchStatus.REFUSED
        return LaunchOutcome(status, lifecycle.get(conn, uuid), said)
    except ProviderError as exc:
        said = _masked(exc, env)
        finish_action(conn, intent, ok=False, result=f"outcome unknown: {said}")
        return LaunchOutcome(LaunchStatus.UNKNOWN, row, said)
    try:
        with transaction(conn):  # the outcome and the row's vast id together
            settle(conn, intent, ok=True, result=f"instance {vast_id}", vast_id=vast_id)
            # destroyed_at cleared: a kill that raced the create must not hide the machine now rented
            lifecycle.update_fields(conn, uuid, {"vast_id": vast_id, "destroyed_at": None})
    except (VastctlError, sqlite3.Error) as exc:
        detail = exc.__cause__ if isinstance(exc.__cause__, sqlite3.Error) else exc  # SQLite's words, not "retry"
        raise Unavailable(f"vast rented instance {vast_id} ({label}) but the state file could not record it"
                          f" ({detail}); free space for the file (do not launch again to make up for it):"
                          f" {label} stays launching with a pending launch in the audit, and reconcile finds the"
                          " machine by its label once the file can be written") from exc
    row = lifecycle.get(conn, uuid)
    if row["state"] == State.KILLED:  # killed while the create was in flight: end the billing now
        destroy(conn, provider, row, actor=actor, now=now)
        row = lifecycle.get(conn, uuid)
    return LaunchOutcome(LaunchStatus.LAUNCHED, row)


def _not_rented(conn: sqlite3.Connection, uuid: str, why: str, actor: str, cause: Cause, now: datetime) -> None:
    """Kill a launching row whose create surely rented nothing (code start_failed) and mark it destroyed; its
    event keeps the launch's cause."""
    lifecycle.kill(conn, uuid, why, source=actor, code=KillCode.START_FAILED, cause=cause, now=now)
    mark(conn, uuid, {"destroyed_at": clock.to_iso(now)})


def _masked(exc: Exception, env: Mapping[str, str]) -> str:
    """A market's error as we show and store it: a secret handed to the machine (token, key) never, even quoted."""
    text = str(exc)
    for name, value in env.items():
        if name not in PUBLIC_ENV and len(value) >= upstream.MIN_SECRET_CHARS:
            text = text.replace(value, upstream.MASK)
    return upstream.mask(text)


def _join(conn: sqlite3.Connection, config: Config, label: str) -> tuple[dict[str, str], InstanceChanges]:
    """(env for the boot script's join step, row fields) for launch.join.

    ssh: a port and a fresh key pair; the private half goes into the env only (the audit masks it, and
    every text this process shows or stores from now on masks it too), the public half onto the row.
    """
    if config.launch.join == "command":
        return {"VASTCTL_JOIN": "command", "VASTCTL_JOIN_CMD": config.launch.join_command}, {}
    if not tunnel.enabled(config):
        return {}, {}
    port = tunnel.allocate_port(conn, config)
    private, public = tunnel.new_key_pair(label)
    env = tunnel.machine_env(config, port, private)
    upstream.remember_secret(private)
    upstream.remember_secret(env["VASTCTL_TUNNEL_KEY"])
    return env, {"tunnel_port": port, "tunnel_public_key": public}


def _new_identity(conn: sqlite3.Connection, prefix: str) -> tuple[str, str]:
    while True:
        uuid = identities.new_uuid()
        label = prefix + uuid.replace("-", "")[:8]
        if not instances.label_taken(conn, label):
            return uuid, label
