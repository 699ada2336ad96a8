"""One reconcile pass, dry or not, by one code path: take the lease, list every vast instance, probe the
tunnels, decide (decide.plan), record what was seen (listing), apply (effects), bring the tunnel keys and
nginx's upstream list in line with the rows.

What a pass changes goes through a `Live` pass's methods; a dry run is the same pass through `DryRun`, whose
methods change nothing and whose apply only reports each action as planned.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from datetime import datetime
from typing import Callable, Iterator, Sequence, cast

from vastctl import detached
from vastctl.clock import Clock
from vastctl.config import Config
from vastctl.errors import Unavailable
from vastctl.facts import provers, tunnel
from vastctl.guard import Action
from vastctl.providers.base import DeadlinePassed, Provider, ProviderError, RemoteInstance
from vastctl.reconcile import listing as listing_cache
from vastctl.reconcile.decide import ListingDistrusted, Matched, SnapshotRow, match, plan
from vastctl.reconcile.effects import Budget, PassResult, apply, reported
from vastctl.state import instances, locks, settings

LEASE = "reconcile"
LEASE_TTL_S = 10 * 60  # renewed before each action; a crashed holder on this host is ignored at once (locks.py)
LEASE_SLACK_S = 5 * 60  # the lease lasts at least this beyond reconcile.deadline
PLANNED = "planned (dry run)"


class Live:
    """What a pass changes, step by step: the lease, the tunnels' probe, the listing cache, the actions, the
    tunnel keys and nginx's upstream list after."""

    def __init__(self, conn: sqlite3.Connection, config: Config, clock: Clock):
        self.conn, self.config, self.clock = conn, config, clock

    @contextlib.contextmanager
    def lease(self) -> Iterator[Callable[[], None]]:
        """Held for the pass; yields the keepalive that renews it (run before each action)."""
        with locks.held(self.conn, LEASE, ttl_s=lease_ttl(self.config), now=self.clock.now()) as lease:
            yield lambda: lease.renew(self.clock.now())

    def listing_failed(self, error: str, now: datetime) -> None:
        listing_cache.record_failed_listing(self.conn, error, now)

    def probe_tunnels(self, now: datetime) -> None:
        tunnel.check(self.conn, self.config, now=now)  # joined or not, before the plan reads the rows

    def listed(self, rows: Sequence[SnapshotRow], listing: Sequence[RemoteInstance], matched: Matched,
               now: datetime) -> None:
        listing_cache.record_listing(self.conn, rows, listing, matched, now)

    def apply(self, provider: Provider, actions: Sequence[Action], *, now: datetime, keepalive: Callable[[], None],
              listing: Sequence[RemoteInstance], budget: Budget) -> PassResult:
        return apply(self.conn, provider, actions, self.config, now=now, keepalive=keepalive, listing=listing,
                     budget=budget)

    def after(self, budget: Budget | None = None) -> list[str]:
        """The tunnel account's keys and nginx's upstream list brought in line with the rows; what failed.
        The reload is judged by its exit and given no longer than what is left of the pass's deadline."""
        left = None if budget is None else budget.deadline - self.clock.monotonic()
        reload = functools.partial(detached.run, limit=left)
        errors = []
        for step in (tunnel.write_authorized_keys, functools.partial(provers.refresh, run=reload)):
            try:
                step(self.conn, self.config)
            except Unavailable as exc:
                errors.append(str(exc))
        return errors


class DryRun(Live):
    """The same pass with every change left out: no lease, no probe, no cache, nothing applied."""

    @contextlib.contextmanager
    def lease(self) -> Iterator[Callable[[], None]]:
        yield lambda: None

    def listing_failed(self, error: str, now: datetime) -> None:
        pass

    def probe_tunnels(self, now: datetime) -> None:
        pass

    def listed(self, rows: Sequence[SnapshotRow], listing: Sequence[RemoteInstance], matched: Matched,
               now: datetime) -> None:
        pass

    def apply(self, provider: Provider, actions: Sequence[Action], *, now: datetime, keepalive: Callable[[], None],
              listing: Sequence[RemoteInstance], budget: Budget) -> PassResult:
        return PassResult(actions=[reported(action, PLANNED) for action in actions], dry_run=True)

    def after(self, budget: Budget | None = None) -> list[str]:
        return []


def run_pass(conn: sqlite3.Connection, provider: Provider, config: Config, *, clock: Clock,
             dry_run: bool = False) -> PassResult:
    """One reconcile pass. Raises Unavailable (exit 1) when the lease is held, the listing failed, or it is
    distrusted; in each of those cases nothing was killed. `dry_run` plans and changes nothing at all.

    The pass reads its time from `clock` (the system clock from the CLI, virtual time in the simulator)
    and ends by `reconcile.deadline` on it (cron starts the next one a minute later): the
    provider starts no call and waits for no retry past it, and the vast calls left are skipped and
    recorded; the result then has `deadline_passed` set (the CLI exits 1).
    """
    changes = DryRun(conn, config, clock) if dry_run else Live(conn, config, clock)
    budget = Budget(clock, config.reconcile.deadline)
    previous, provider.deadline = getattr(provider, "deadline", None), budget.deadline
    try:
        with changes.lease() as keepalive:
            try:
                listing = _list(provider, budget)
            except ProviderError as exc:
                changes.listing_failed(str(exc), clock.now())
                raise
            # The pass judges and stamps its events as of the listing's return, not its own start: the
            # listing may take seconds (retries), and machines' reports written meanwhile carry later times,
            # so a pass stamped at its start would write events whose times run backwards in id order.
            now = clock.now()
            changes.probe_tunnels(now)
            rows = _snapshot(conn)
            matched = match(rows, listing, config.vast.label_prefix)
            first_seen, history = listing_cache.strays_context(conn, config, matched.unclaimed)
            try:
                actions = plan(rows, listing, settings.effective(conn, config), config, now,
                               first_seen=first_seen, history=history, matched=matched)
            except ListingDistrusted as exc:
                changes.listing_failed(str(exc), now)
                raise
            changes.listed(rows, listing, matched, now)
            result = changes.apply(provider, actions, now=now, keepalive=keepalive, listing=listing, budget=budget)
            result.listed = len(listing)
            result.errors[:0] = listing_notes(provider) + changes.after(budget)
            return result
    finally:
        provider.deadline = previous


def _snapshot(conn: sqlite3.Connection) -> list[SnapshotRow]:
    """The live rows; a row missing from the last k good listings carries the first of them as vast_missing_since
    (the k-th newest good listing), so the rules can tell how long it has really been missing."""
    # the rows as read, extended in place: a SnapshotRow is an InstanceRow that may carry one key more
    rows = cast(list[SnapshotRow], instances.undestroyed(conn))
    for row in rows:
        missing = int(row.get("vast_missing") or 0)
        if missing > 0:
            first = conn.execute("SELECT at FROM vast_listings WHERE ok = 1 ORDER BY id DESC LIMIT 1 OFFSET ?",
                                 (missing - 1,)).fetchone()
            row["vast_missing_since"] = first["at"] if first else None
    return rows


def _list(provider: Provider, budget: Budget) -> list[RemoteInstance]:
    try:
        listing = list(provider.list_instances())
    except DeadlinePassed as exc:
        raise DeadlinePassed(f"reconcile stopped at its deadline ({budget}) before vast listed the fleet: {exc};"
                             " nothing was planned or killed, the next pass tries again") from None
    ids = [entry.id for entry in listing]
    if len(set(ids)) != len(ids):
        raise ProviderError("vast listing names the same instance twice; not trusting it")
    return listing


def lease_ttl(config: Config) -> float:
    """The lease outlives a pass however long reconcile.deadline is, so a second pass is turned away meanwhile."""
    return max(LEASE_TTL_S, config.reconcile.deadline + LEASE_SLACK_S)


def listing_notes(provider: Provider) -> list[str]:
    """What the provider left out of its last listing (entries it could not represent), to be reported."""
    notes = getattr(provider, "listing_notes", None)
    return [str(note) for note in notes] if isinstance(notes, list) else []
