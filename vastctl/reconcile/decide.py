"""reconcile's decisions, pure: every row not yet destroyed and one good listing in, the actions out.

No database, no provider, no clock but the `now` it is given: run.py reads the snapshots, effects.py does
what this decides. Rules, in the order `plan()` applies them to one live row (first match wins):

  disappeared         missing from `disappear_confirmations` consecutive good listings, confirmed (below)
  start_failed        vast's status_msg reports a start failure and the container is not running
  exited / offline    vast status exited (or unknown/offline) in two consecutive good listings, confirmed
  scheduling_timeout  resumed, still launching, vast keeps it stopped/created past SCHEDULING_DEADLINE_S
  bench_failed        bench_done with a rate below the current min_bench_rate (a lost bench report)
  timeout_<state>     launching/registered/params_done/bench_done longer than timeouts.<state>
  heartbeat_timeout   running without a heartbeat for longer than timeouts.heartbeat
  tunnel_down         running with a tunnel (launch.join ssh) the manager could not reach the daemon through
                      for longer than tunnel.down_timeout (never joined: counted from `running`)
  route_failing       running, and the proof router reported it: ejected for route.fail_threshold calls in a
                      row dropped, failed or held to their deadline, taken back, and ejected again with no good
                      answer between (route_failing_since, route_failure; vastctl/route/dispatch.py). An
                      ejection alone or refused connects (a daemon restarting) never set it

Confirmed: vast's word alone (missing, a dead status) kills only once it has held for
reconcile.confirm_after of real time (default a minute: what cron's two listings span) and the
machine has sent no heartbeat within that span. Two listings can be seconds apart (a webhook wake
lists twice in a few seconds), and a few seconds of `offline` at vast is a flap, not a death; a
machine that heartbeats is alive whatever vast's listing says.

The vast-status rules (start_failed, exited/offline, scheduling_timeout) skip
`stopped` rows: their container is down because we asked; `start` moves them
back to launching, under every rule again.

Killed rows whose machine is not confirmed destroyed are destroyed again on
every pass. A vast instance labelled with our prefix that has no row is an
orphan: nothing reports to us from it, so after a grace of timeouts.launching
(the time a healthy machine has to register, which would have adopted it)
it is destroyed (one event, code `orphan`). A machine vast still lists
STILL_LISTED_GRACE_S after confirming its destroy is destroyed again.
Instances without our prefix and no row are never touched.

A machine's own word is a claim: a row is paired with a listing entry by the
vast id the manager recorded, else only by the row's label (a claimed id
picks among those).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping, Sequence

from vastctl import clock, guard, upstream
from vastctl.config import Config
from vastctl.errors import Unavailable
from vastctl.facts import tunnel
from vastctl.guard import Action, Kind
from vastctl.providers.base import RemoteInstance
from vastctl.state.lifecycle import (
    LIVE_STATES,
    VAST_DEAD_CODES,  # vast status → kill code
    KillCode,
    State,
)
from vastctl.state.rows import GoneRow, InstanceRow

ACTOR = "reconcile"
SCHEDULING_DEADLINE_S = 5 * 60  # vast's advice: still scheduling after ~30 s means the GPU is taken
STILL_LISTED_GRACE_S = 5 * 60  # vast confirmed a destroy but still lists the instance: destroy again after this
OUTBID_GRACE_S = 2 * 3600  # an outbid machine is waited for this long after its last heartbeat, then timed out
# vast's status_msg texts that say the container never started, by how they begin (docs/interface.md, "Start
# failures"): a kill at once, code start_failed. Every other text is shown (fleet --json, the dashboard), never
# acted on: the listing's status decides (exited, unknown, offline, or a resumed machine never scheduled).
START_FAILURES = (
    ("Error response from daemon:", "Docker refused to create, start or pull the container"),
    ("docker: Error response from daemon:", "the same refusal, as docker's command line words it"),
    ("OCI runtime create failed", "the container runtime (runc, the NVIDIA hook) could not create it"),
)
REASON_CHARS = 160  # vast's text quoted into a reason (an event, the table), through upstream.clip
SCHEDULING_STATUSES = frozenset({None, "", "stopped", "created", "scheduling"})
TIMED_STATES = {  # a state with a time limit: its timeouts.<name>, and the code of a kill for overstaying it
    State.LAUNCHING: ("launching", KillCode.TIMEOUT_LAUNCHING),
    State.REGISTERED: ("registered", KillCode.TIMEOUT_REGISTERED),
    State.PARAMS_DONE: ("params_done", KillCode.TIMEOUT_PARAMS_DONE),
    State.BENCH_DONE: ("bench_done", KillCode.TIMEOUT_BENCH_DONE),
}


class ListingDistrusted(Unavailable):
    """Too much of the live fleet vanished at once: the listing is not believed, nobody is killed (exit 1)."""



class SnapshotRow(InstanceRow, total=False):
    """A row as a pass plans from it (run._snapshot): a row missing from the last k good listings carries the
    first of them."""

    vast_missing_since: str | None  # the k-th newest good listing's time (None: fewer good listings than that)


@dataclass
class Matched:
    """Which listing entry each row is, and what was learned by matching."""

    by_uuid: dict[str, RemoteInstance]
    recovered: dict[str, int]  # uuid → vast_id found by label (a launch that crashed before recording it)
    unclaimed: list[RemoteInstance]  # listing entries no unfinished row claims



def stored_code(value: str | None) -> KillCode | None:
    """A row's kill_code as a KillCode; one no code names (written by hand) is left out rather than trusted."""
    try:
        return KillCode(value) if value is not None else None
    except ValueError:
        return None


def match(rows: Sequence[SnapshotRow], listing: Sequence[RemoteInstance], label_prefix: str = "") -> Matched:
    """Pair rows with listing entries: by the vast_id the manager recorded, else by label.

    A row without a vast_id yet (a launch that crashed before recording it, or
    a machine adopted by `register`) is paired only with an entry vast lists
    under the row's label; a machine's claimed id only picks among those. A
    row the manager did not launch is paired only with an entry carrying our
    label prefix: a machine cannot adopt an instance we would never touch.
    """
    by_id = {entry.id: entry for entry in listing}
    by_uuid: dict[str, RemoteInstance] = {}
    claimed: set[int] = set()
    without_id = []
    for row in rows:
        vast_id = row.get("vast_id")
        if vast_id is None:
            without_id.append(row)
        elif vast_id in by_id:
            by_uuid[row["uuid"]] = by_id[vast_id]
            claimed.add(vast_id)
    recovered: dict[str, int] = {}
    if without_id:
        by_label: dict[str, list[RemoteInstance]] = defaultdict(list)
        for entry in listing:
            if entry.label and entry.id not in claimed:
                by_label[entry.label].append(entry)
        for row in without_id:
            if not launched(row) and not carries_prefix(row["label"], label_prefix):
                continue
            candidates = [entry for entry in by_label.get(row["label"], ()) if entry.id not in claimed]
            if candidates:
                claim = [entry for entry in candidates if entry.id == row.get("claimed_vast_id")]
                entry = (claim or sorted(candidates, key=lambda item: item.id))[0]
                by_uuid[row["uuid"]] = entry
                recovered[row["uuid"]] = entry.id
                claimed.add(entry.id)
    unclaimed = [entry for entry in listing if entry.id not in claimed]
    return Matched(by_uuid=by_uuid, recovered=recovered, unclaimed=unclaimed)


def launched(row: SnapshotRow) -> bool:
    """Whether the manager rented this machine (launch records the offer) rather than adopting it."""
    return row.get("offer_id") is not None


def carries_prefix(label: str | None, prefix: str) -> bool:
    """Our label prefix marks the instances reconcile may act on; with no prefix, none are."""
    return bool(prefix) and label is not None and label.startswith(prefix)


def _expected_in_listing(row: InstanceRow, matched: Matched) -> bool:
    """A row vast should be listing: it has a vast id, and it is not a fresh launch vast may not list yet."""
    has_id = row.get("vast_id") is not None or row["uuid"] in matched.recovered
    return has_id and (row.get("vast_seen_at") is not None or row["state"] != State.LAUNCHING)


def missing_after(row: InstanceRow, matched: Matched) -> int:
    """The row's count of consecutive good listings it was missing from, this listing included."""
    if row["uuid"] in matched.by_uuid:
        return 0
    if _expected_in_listing(row, matched):
        return int(row.get("vast_missing") or 0) + 1
    return int(row.get("vast_missing") or 0)


def check_trust(rows: Sequence[SnapshotRow], matched: Matched, config: Config) -> None:
    """Raise ListingDistrusted when more than max_vanish_fraction of the live fleet vanished at once.

    "At once" counts rows that were seen in the previous good listing and are
    missing from this one; rows already counted missing do not count again.
    """
    fleet = [row for row in rows if row["state"] in LIVE_STATES and _expected_in_listing(row, matched)]
    vanished = [row for row in fleet if row["uuid"] not in matched.by_uuid and not row.get("vast_missing")]
    limit = config.reconcile.max_vanish_fraction
    if vanished and len(vanished) > limit * len(fleet):
        names = ", ".join(sorted(row["label"] for row in vanished)[:5]) + (", …" if len(vanished) > 5 else "")
        raise ListingDistrusted(
            f"vast listing distrusted: {len(vanished)} of {len(fleet)} live machines vanished at once"
            f" ({names}; max_vanish_fraction {limit:g}); nothing was killed. If they really are gone, kill them"
            " with `vastctl kill LABEL --reason …`; otherwise retry later"
        )


def plan(
    rows: Sequence[SnapshotRow],
    listing: Sequence[RemoteInstance],
    settings: Mapping[str, float],
    config: Config,
    now: datetime,
    *,
    first_seen: Mapping[int, str] | None = None,
    history: Mapping[int, GoneRow] | None = None,
    matched: Matched | None = None,
) -> list[Action]:
    """What one pass should do, from snapshots only.

    rows: every instance row not yet destroyed, as it was before this listing
    (vast_missing / vast_status are the previous listing's). listing: one good
    listing. first_seen: vast_id → ISO time the cache first saw it (orphan
    grace; unknown ids count as first seen now). history: vast_id → destroyed
    row, for listed instances whose row is already destroyed. matched: match(rows, listing), when the caller
    already paired them (the pass does, for the strays' context).
    Raises ListingDistrusted instead of planning kills from a broken listing.
    """
    if matched is None:
        matched = match(rows, listing, config.vast.label_prefix)
    check_trust(rows, matched, config)
    first_seen = first_seen or {}
    history = history or {}
    actions: list[Action] = []
    for row in rows:
        entry = matched.by_uuid.get(row["uuid"])
        vast_id = row.get("vast_id") if row.get("vast_id") is not None else matched.recovered.get(row["uuid"])
        if row["state"] == State.KILLED:
            if not row.get("destroyed_at"):
                actions.append(_destroy_row(row, vast_id, now))
            continue
        verdict = _verdict(row, entry, matched, settings, config, now)
        if verdict is None:
            continue
        code, reason = verdict
        actions.append(Action(
            kind=Kind.KILL, actor=ACTOR, label=row["label"], reason=reason, uuid=row["uuid"], vast_id=vast_id,
            code=code, expect=(row["state"], row.get("state_since"), row.get("last_heartbeat_at")),
        ))
        actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=row["label"], reason=f"killed: {reason}",
                              uuid=row["uuid"], vast_id=vast_id, code=code))
    actions.extend(_strays(matched.unclaimed, config, now, first_seen, history))
    return actions


_STATES = {str(state): state for state in State}


def start_failure(status_msg: str | None) -> str | None:
    """What a status_msg that begins as a START_FAILURES entry means; None for any other text."""
    text = (status_msg or "").strip().casefold()
    return next((meaning for start, meaning in START_FAILURES if text.startswith(start.casefold())), None)


def _verdict(row: SnapshotRow, entry: RemoteInstance | None, matched: Matched, settings: Mapping[str, float],
             config: Config, now: datetime) -> tuple[KillCode, str] | None:
    """The kill code and reason for one live row, or None when it may live: the rules in the module docstring's
    order, first match wins."""
    state = _STATES.get(row["state"]) or State(row["state"])  # the enum's own lookup costs a call per row
    verdict = _listing_verdict(row, state, entry, matched, config, now) or _bench_verdict(row, state, settings)
    if verdict is not None:
        return verdict
    since = clock.from_iso(row["state_since"])
    if since is None:  # every row has entered its state at some moment; a row without one is not judged
        return None
    if state in TIMED_STATES:
        return _overstayed(state, since, config, now)
    if state is State.RUNNING:
        return _running_verdict(row, entry, since, config, now)
    return None


def _listing_verdict(row: SnapshotRow, state: State, entry: RemoteInstance | None, matched: Matched, config: Config,
                     now: datetime) -> tuple[KillCode, str] | None:
    """What vast's listing says of the row: missing from it (disappeared), or listed with a status that kills."""
    if entry is None:
        return _disappeared(row, matched, config, now)
    if state is State.STOPPED:  # a machine we stopped is not running because we asked: no status rule
        return None
    return _vast_status_verdict(row, state, entry, config, now)


def _disappeared(row: SnapshotRow, matched: Matched, config: Config, now: datetime) -> tuple[KillCode, str] | None:
    """disappeared: missing from enough consecutive good listings, confirmed."""
    missing = missing_after(row, matched)
    needed = max(1, config.reconcile.disappear_confirmations)
    if missing >= needed and confirmed(row, missing_since(row), config, now):
        seen = clock.from_iso(row.get("vast_seen_at"))
        last = f", last seen {clock.human_age(seen, now)} ago" if seen else ", never seen"
        return KillCode.DISAPPEARED, (f"disappeared from vast: instance {row.get('vast_id')} missing from {missing}"
                                      f" consecutive listings{last}")
    return None


def _vast_status_verdict(row: SnapshotRow, state: State, entry: RemoteInstance, config: Config,
                         now: datetime) -> tuple[KillCode, str] | None:
    """start_failed, exited / offline and scheduling_timeout: what the listing says of a machine not stopped."""
    status = entry.actual_status or None
    if status != "running" and start_failure(entry.status_msg):
        return KillCode.START_FAILED, f"vast reports a start failure (status {status or 'none'}): {upstream.clip(entry.status_msg, REASON_CHARS)}"
    if (status in VAST_DEAD_CODES and row.get("vast_status") in VAST_DEAD_CODES and row.get("vast_seen_at")
            and confirmed(row, dead_since(row), config, now)):
        dead_from = dead_since(row) or now
        detail = f": {upstream.clip(entry.status_msg, REASON_CHARS)}" if entry.status_msg else ""
        return VAST_DEAD_CODES[status], f"vast status {status} for {clock.human_age(dead_from, now)} (2 listings){detail}"
    if (state is State.LAUNCHING and row.get("resumed_at") and status in SCHEDULING_STATUSES
            and (entry.intended_status in (None, "", "running"))):
        return _scheduling_timeout(row, status, config, now)
    return None


def _scheduling_timeout(row: SnapshotRow, status: str | None, config: Config,
                        now: datetime) -> tuple[KillCode, str] | None:
    """scheduling_timeout: resumed, and vast has not scheduled it past the deadline (its GPU is likely taken)."""
    resumed = clock.from_iso(row["resumed_at"])
    assert resumed is not None  # from_iso is None only for an empty text, and resumed_at was checked set
    deadline = min(SCHEDULING_DEADLINE_S, config.timeouts.launching)
    if (now - resumed).total_seconds() > deadline:
        return KillCode.SCHEDULING_TIMEOUT, (
            f"resumed {clock.human_age(resumed, now)} ago but vast still has it {status or 'unscheduled'}"
            f" (limit {clock.human_duration(deadline)}): its GPU is likely taken"
        )
    return None


def _bench_verdict(row: SnapshotRow, state: State, settings: Mapping[str, float]) -> tuple[KillCode, str] | None:
    """bench_failed: still bench_done with a rate below the current min_bench_rate (a lost bench report)."""
    bench_rate = row.get("bench_rate")
    if state is not State.BENCH_DONE or bench_rate is None:
        return None
    gate = float(settings["min_bench_rate"])
    if float(bench_rate) < gate:
        return KillCode.BENCH_FAILED, f"bench rate {bench_rate:g} below gate {gate:g} (still bench_done)"
    return None


def _overstayed(state: State, since: datetime, config: Config, now: datetime) -> tuple[KillCode, str] | None:
    """timeout_<state>: in a state with a time limit for longer than its timeouts.<state>."""
    name, timed_out = TIMED_STATES[state]
    limit = getattr(config.timeouts, name)
    if (now - since).total_seconds() > limit:
        return timed_out, f"{name} for {clock.human_age(since, now)} (limit {clock.human_duration(limit)})"
    return None


def _running_verdict(row: SnapshotRow, entry: RemoteInstance | None, since: datetime, config: Config,
                     now: datetime) -> tuple[KillCode, str] | None:
    """heartbeat_timeout, tunnel_down and route_failing, for a running machine (one paused by an outbid bid, with a
    recent heartbeat, is none of them)."""
    limit = config.timeouts.heartbeat
    beat = clock.from_iso(row.get("last_heartbeat_at"))
    paused = (entry is not None and outbid(entry)) or row.get("outbid_since") is not None
    if paused and beat is not None and (now - beat).total_seconds() < OUTBID_GRACE_S:
        return None  # paused by vast for a higher bid (or restarting since), disk kept: not dead
    if not guard.heartbeat_fresh(row, limit, now):  # the one liveness rule, the guard's too
        if beat is None or beat < since:
            return KillCode.HEARTBEAT_TIMEOUT, f"running for {clock.human_age(since, now)} without a heartbeat (limit {clock.human_duration(limit)})"
        return KillCode.HEARTBEAT_TIMEOUT, f"no heartbeat for {clock.human_age(beat, now)} (limit {clock.human_duration(limit)})"
    return _tunnel_down(row, config, now) or _route_failing(row, since, now)


def _tunnel_down(row: SnapshotRow, config: Config, now: datetime) -> tuple[KillCode, str] | None:
    """tunnel_down: the daemon unreachable through its tunnel for longer than tunnel.down_timeout."""
    # no tunnel, nothing to be down (and no copy of every running row made to ask)
    down = clock.from_iso(tunnel.down_since(row)) if row.get("tunnel_port") is not None else None
    limit = config.tunnel.down_timeout
    if down is not None and (now - down).total_seconds() > limit:
        how = "unreachable" if tunnel.joined_this_run(row) else "never reached"
        return KillCode.TUNNEL_DOWN, (f"{how} through its tunnel (127.0.0.1:{row['tunnel_port']}) for"
                                      f" {clock.human_age(down, now)} (limit {clock.human_duration(limit)})")
    return None


def _route_failing(row: SnapshotRow, since: datetime, now: datetime) -> tuple[KillCode, str] | None:
    """route_failing: the proof router set it aside in this spell in `running`."""
    failing = clock.from_iso(row.get("route_failing_since"))
    if failing is not None and failing >= since:  # set aside in this spell in `running`
        return KillCode.ROUTE_FAILING, (f"the proof router set it aside {clock.human_age(failing, now)} ago:"
                                        f" {upstream.clip(row.get('route_failure') or 'no detail', REASON_CHARS)}")
    return None


def dead_since(row: SnapshotRow) -> datetime | None:
    """When the listings first showed the (dead) status the row holds: vast_status_since, else the last sighting."""
    return clock.from_iso(row.get("vast_status_since") or row.get("vast_seen_at"))


def missing_since(row: SnapshotRow) -> datetime | None:
    """The first good listing the row was missing from (run.py reads it from the listing history), else the
    last sighting; None before any listing missed it (this one is the first)."""
    if not row.get("vast_missing"):
        return None
    return clock.from_iso(row.get("vast_missing_since") or row.get("vast_seen_at"))


def confirmed(row: SnapshotRow, since: datetime | None, config: Config, now: datetime) -> bool:
    """vast's word about a machine has held for reconcile.confirm_after of real time, and the machine has not
    heartbeated within that span (module docstring)."""
    span = config.reconcile.confirm_after
    if (now - (since or now)).total_seconds() < span:
        return False
    beat = clock.from_iso(row.get("last_heartbeat_at"))
    return beat is None or (now - beat).total_seconds() >= span


def outbid(entry: RemoteInstance) -> bool:
    """An interruptible instance vast has stopped while we asked it to run: outbid (docs/interface.md, "interruptible (bid) rentals").
    It stays listed, keeps its disk and bills storage; it resumes when its bid wins again."""
    return entry.raw.get("is_bid") is True and "stopped" in (entry.actual_status, entry.cur_state)


def _destroy_row(row: SnapshotRow, vast_id: int | None, now: datetime) -> Action:
    killed = clock.from_iso(row.get("killed_at") or row.get("state_since"))
    attempts = int(row.get("destroy_attempts") or 0)
    reason = f"killed {clock.human_age(killed, now)} ago ({row.get('kill_code') or 'no code'}), not yet destroyed"
    if attempts:
        reason += f"; attempt {attempts + 1}, last error: {upstream.clip(row.get('destroy_error') or '?', REASON_CHARS)}"
    return Action(kind=Kind.DESTROY, actor=ACTOR, label=row["label"], reason=reason, uuid=row["uuid"],
                  vast_id=vast_id, code=stored_code(row.get("kill_code")))


def _strays(unclaimed: Iterable[RemoteInstance], config: Config, now: datetime,
            first_seen: Mapping[int, str], history: Mapping[int, GoneRow]) -> list[Action]:
    """Listed instances no unfinished row claims: orphans with our prefix, or machines destroyed but still listed."""
    prefix = config.vast.label_prefix
    grace = config.timeouts.launching
    actions = []
    for entry in unclaimed:
        gone = history.get(entry.id)
        if gone is not None and entry.label == gone["label"]:
            destroyed = clock.from_iso(gone["destroyed_at"]) or now
            if entry.cur_state != "unloaded" and (now - destroyed).total_seconds() > STILL_LISTED_GRACE_S:
                actions.append(Action(
                    kind=Kind.DESTROY, actor=ACTOR, label=gone["label"], vast_id=entry.id,
                    code=stored_code(gone.get("kill_code")),
                    reason=(f"destroyed {clock.human_age(destroyed, now)} ago but vast still lists instance {entry.id}"
                            f" ({entry.actual_status or 'no status'})"),
                ))
            continue
        if not carries_prefix(entry.label, prefix):
            continue  # not ours: never touched
        seen = clock.from_iso(first_seen.get(entry.id)) or now
        if (now - seen).total_seconds() > grace:
            actions.append(Action(
                kind=Kind.DESTROY, actor=ACTOR, label=entry.label or "", vast_id=entry.id, code=KillCode.ORPHAN,
                reason=(f"orphan: vast instance {entry.id} carries our prefix but has no row and never registered;"
                        f" listed for {clock.human_age(seen, now)} (grace {clock.human_duration(grace)})"),
            ))
    return actions

