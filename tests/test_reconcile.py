"""reconcile.plan: every rule, from plain snapshots and a fixed clock. No database, no mocks."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from helpers.reconcile_rows import NOW, SETTINGS, ago, kills, row, seen

from vastctl import clock
from vastctl.config import from_mapping
from vastctl.providers.base import RemoteInstance
from vastctl.reconcile import ListingDistrusted, match, plan
from vastctl.reconcile.decide import START_FAILURES
from vastctl.state.lifecycle import KillCode


def cfg(**sections):
    return from_mapping(sections)


def destroys(actions):
    return [(a.label, a.vast_id) for a in actions if a.kind == "destroy"]


def test_a_healthy_fleet_needs_nothing():
    rows = [row(f"vastctl-{n}") for n in range(5)]
    assert plan(rows, [seen(r) for r in rows], SETTINGS, cfg(), NOW) == []


# --- vanish: confirmations and distrust --------------------------------------------------------


def test_vanished_only_after_the_configured_consecutive_listings():
    rows = [row(f"vastctl-{n}") for n in range(4)]
    listing = [seen(r) for r in rows[1:]]
    assert plan(rows, listing, SETTINGS, cfg(), NOW) == []  # first miss: counted, not killed
    rows[0]["vast_missing"] = 1
    actions = plan(rows, listing, SETTINGS, cfg(), NOW)
    assert kills(actions) == {("vastctl-0", "disappeared")}
    kill = actions[0]
    assert "missing from 2 consecutive listings" in kill.reason and "last seen 1m ago" in kill.reason
    assert destroys(actions) == [("vastctl-0", 100)]  # destroy follows the kill (vast may have it billing somewhere)


def test_confirmations_are_configurable():
    rows = [row(f"vastctl-{n}") for n in range(4)]
    rows[0]["vast_missing"] = 2
    listing = [seen(r) for r in rows[1:]]
    three = cfg(reconcile={"disappear_confirmations": 3})
    assert kills(plan(rows, listing, SETTINGS, three, NOW)) == {("vastctl-0", "disappeared")}
    rows[0]["vast_missing"] = 1
    assert plan(rows, listing, SETTINGS, three, NOW) == []


def test_a_reappearing_machine_is_not_killed():
    rows = [row("vastctl-1", vast_missing=1), row("vastctl-2"), row("vastctl-3")]
    assert plan(rows, [seen(r) for r in rows], SETTINGS, cfg(), NOW) == []


def test_empty_listing_against_a_live_fleet_is_distrusted():
    rows = [row(f"vastctl-{n}") for n in range(3)]
    with pytest.raises(ListingDistrusted, match="3 of 3 live machines vanished at once"):
        plan(rows, [], SETTINGS, cfg(), NOW)


def test_even_confirmed_vanish_is_not_killed_from_a_distrusted_listing():
    rows = [row(f"vastctl-{n}", vast_missing=0) for n in range(3)]
    rows[0]["vast_missing"] = 5
    with pytest.raises(ListingDistrusted):
        plan(rows, [], SETTINGS, cfg(), NOW)


def test_distrust_threshold_is_more_than_the_fraction():
    rows = [row(f"vastctl-{n}", vast_missing=1) for n in range(4)]
    for r in rows:
        r["vast_missing"] = 0
    listing = [seen(r) for r in rows[2:]]
    plan(rows, listing, SETTINGS, cfg(), NOW)  # 2 of 4 = 0.5: not more than 0.5, trusted
    with pytest.raises(ListingDistrusted):
        plan(rows, listing[1:], SETTINGS, cfg(), NOW)  # 3 of 4
    plan(rows, listing[1:], SETTINGS, cfg(reconcile={"max_vanish_fraction": 0.8}), NOW)


def test_already_missing_machines_do_not_count_as_vanishing_at_once():
    rows = [row(f"vastctl-{n}") for n in range(4)]
    rows[0]["vast_missing"] = rows[1]["vast_missing"] = 1  # these went in an earlier, trusted listing
    listing = [seen(r) for r in rows[3:]]  # and now vastctl-2 goes too: 1 of 4 at once
    assert kills(plan(rows, listing, SETTINGS, cfg(), NOW)) == {("vastctl-0", "disappeared"),
                                                              ("vastctl-1", "disappeared")}


def test_a_fresh_launch_vast_does_not_list_yet_is_not_missing():
    fresh = row("vastctl-1", state="launching", state_since=ago(minutes=1), vast_seen_at=None, vast_status=None,
                last_heartbeat_at=None)
    assert plan([fresh], [], SETTINGS, cfg(), NOW) == []


def test_killed_rows_do_not_count_toward_distrust():
    rows = [row("vastctl-1", state="killed", kill_code="operator", killed_at=ago(minutes=1)), row("vastctl-2")]
    actions = plan(rows, [seen(rows[1])], SETTINGS, cfg(), NOW)
    assert destroys(actions) == [("vastctl-1", 101)]


# --- vast's status ------------------------------------------------------------------------------


@pytest.mark.parametrize("status, code", [("exited", "exited"), ("unknown", "offline"), ("offline", "offline")])
def test_dead_status_in_two_listings_kills(status, code):
    r = row("vastctl-1", vast_status=status, vast_seen_at=ago(minutes=3))
    actions = plan([r], [seen(r, status)], SETTINGS, cfg(), NOW)
    assert kills(actions) == {("vastctl-1", code)}
    assert actions[0].reason.startswith(f"vast status {status} for 3m")
    assert destroys(actions) == [("vastctl-1", 101)]


def test_dead_status_seen_once_waits_for_the_next_listing():
    r = row("vastctl-1")
    assert plan([r], [seen(r, "exited")], SETTINGS, cfg(), NOW) == []


def test_a_dead_status_two_listings_saw_seconds_apart_is_a_flap_not_a_kill():
    # a webhook wake lists twice 5 s apart: two listings agree, but vast has said offline for 7 s only
    r = row("vastctl-1", vast_status="offline", vast_status_since=clock.to_iso(NOW - timedelta(seconds=7)),
            vast_seen_at=clock.to_iso(NOW - timedelta(seconds=5)), last_heartbeat_at=ago(minutes=2))
    assert plan([r], [seen(r, "offline")], SETTINGS, cfg(), NOW) == []
    later = NOW + timedelta(seconds=53)  # cron's next pass: a minute of offline, no heartbeat in it
    assert kills(plan([r], [seen(r, "offline")], SETTINGS, cfg(), later)) == {("vastctl-1", "offline")}


def test_the_confirmation_span_is_configurable():
    r = row("vastctl-1", vast_status="exited", vast_status_since=clock.to_iso(NOW - timedelta(seconds=20)),
            vast_seen_at=clock.to_iso(NOW - timedelta(seconds=20)), last_heartbeat_at=ago(minutes=5))
    assert plan([r], [seen(r, "exited")], SETTINGS, cfg(), NOW) == []
    quick = cfg(reconcile={"confirm_after": "15s"})
    assert kills(plan([r], [seen(r, "exited")], SETTINGS, quick, NOW)) == {("vastctl-1", "exited")}


def test_a_machine_heartbeating_inside_the_span_is_not_killed_on_vast_status_alone():
    r = row("vastctl-1", vast_status="offline", vast_status_since=ago(minutes=3), vast_seen_at=ago(minutes=1),
            last_heartbeat_at=clock.to_iso(NOW - timedelta(seconds=20)))
    assert plan([r], [seen(r, "offline")], SETTINGS, cfg(), NOW) == []
    r["last_heartbeat_at"] = clock.to_iso(NOW - timedelta(seconds=70))  # its heartbeats stopped
    assert kills(plan([r], [seen(r, "offline")], SETTINGS, cfg(), NOW)) == {("vastctl-1", "offline")}


def test_a_machine_missing_for_seconds_is_not_disappeared_nor_one_that_heartbeats():
    rows = [row(f"vastctl-{n}") for n in range(4)]
    rows[0].update(vast_missing=1, vast_missing_since=clock.to_iso(NOW - timedelta(seconds=5)),
                   last_heartbeat_at=ago(minutes=3))
    listing = [seen(r) for r in rows[1:]]
    assert plan(rows, listing, SETTINGS, cfg(), NOW) == []
    rows[0]["vast_missing_since"] = ago(minutes=1)
    assert kills(plan(rows, listing, SETTINGS, cfg(), NOW)) == {("vastctl-0", "disappeared")}
    rows[0]["last_heartbeat_at"] = clock.to_iso(NOW - timedelta(seconds=10))
    assert plan(rows, listing, SETTINGS, cfg(), NOW) == []


START_FAILURE_TEXTS = [  # at least one per decide.START_FAILURES entry, as vast has shown each
    "Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create"
    " failed: runc create failed: unable to start container process",
    "Error response from daemon: pull access denied for vastctl/cuzk, repository does not exist",
    "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].",
    "OCI runtime create failed: runc create failed: unable to start container process: error during container init",
    "  error response from daemon: manifest unknown",  # vast's spacing and case may differ
]


@pytest.mark.parametrize("msg", START_FAILURE_TEXTS)
def test_start_failure_text_kills_at_once(msg):
    r = row("vastctl-1", state="launching", state_since=ago(minutes=2), vast_status=None, last_heartbeat_at=None)
    actions = plan([r], [seen(r, "created", status_msg=msg)], SETTINGS, cfg(), NOW)
    assert kills(actions) == {("vastctl-1", "start_failed")}
    assert "start failure" in actions[0].reason and msg.strip()[:20] in actions[0].reason


def test_every_start_failure_entry_has_its_test():
    tested = {start for start, _ in START_FAILURES for msg in START_FAILURE_TEXTS
              if msg.strip().casefold().startswith(start.casefold())}
    assert tested == {start for start, _ in START_FAILURES}


@pytest.mark.parametrize("msg", [
    "permission denied while mounting",  # words a failure might use, but no entry: shown, not acted on
    "Traceback (most recent call last): ...",
    "failed once, retrying",
    "loading image: error fetching layer 3, retrying",
])
def test_other_status_text_is_shown_not_acted_on(msg):
    r = row("vastctl-1", state="launching", state_since=ago(minutes=2), vast_status=None, last_heartbeat_at=None)
    assert plan([r], [seen(r, "created", status_msg=msg)], SETTINGS, cfg(), NOW) == []


def test_vast_text_quoted_into_a_reason_is_escaped_and_bounded():
    hostile = "OCI runtime create failed\x1b[2J\x1b[31m: \x1b[0m \u202eexe.txt\u2028next\x85\x7f " + "x" * 500
    r = row("vastctl-1", state="launching", state_since=ago(minutes=2), vast_status=None, last_heartbeat_at=None)
    (kill, _destroy) = plan([r], [seen(r, "created", status_msg=hostile)], SETTINGS, cfg(), NOW)
    assert kill.reason.isprintable() and len(kill.reason) < 300
    assert "OCI runtime create failed\\x1b[2J\\x1b[31m: \\x1b[0m" in kill.reason and "\\u202eexe.txt" in kill.reason
    assert "\\x7f" in kill.reason


def test_error_text_on_a_running_container_is_stale_not_a_start_failure():
    r = row("vastctl-1")
    assert plan([r], [seen(r, "running", status_msg="failed once, then success")], SETTINGS, cfg(), NOW) == []


def test_resumed_machine_stuck_scheduling_past_its_deadline():
    stuck = row("vastctl-1", state="launching", resumed_at=ago(minutes=6), state_since=ago(minutes=6),
                vast_status="stopped", last_heartbeat_at=ago(hours=2))
    actions = plan([stuck], [seen(stuck, "stopped", intended_status="running")], SETTINGS, cfg(), NOW)
    assert kills(actions) == {("vastctl-1", "scheduling_timeout")}
    assert "resumed 6m ago" in actions[0].reason and "stopped" in actions[0].reason
    assert destroys(actions) == [("vastctl-1", 101)]


def test_resumed_machine_within_its_deadline_or_loading_is_left_alone():
    young = row("vastctl-1", state="launching", resumed_at=ago(minutes=2), state_since=ago(minutes=2))
    loading = row("vastctl-2", state="launching", resumed_at=ago(minutes=9), state_since=ago(minutes=9))
    listing = [seen(young, "stopped"), seen(loading, "loading")]
    assert plan([young, loading], listing, SETTINGS, cfg(), NOW) == []


def test_a_stopped_machine_we_stopped_is_not_scheduling():
    r = row("vastctl-1", state="stopped", resumed_at=ago(hours=5), state_since=ago(hours=3), vast_status="stopped")
    assert plan([r], [seen(r, "stopped", intended_status="stopped")], SETTINGS, cfg(), NOW) == []


# --- timeouts and the gate ----------------------------------------------------------------------


@pytest.mark.parametrize("state, minutes, reason", [
    ("launching", 21, "launching for 21m (limit 20m)"),
    ("registered", 31, "registered for 31m (limit 30m)"),
    ("params_done", 91, "params_done for 1h31m (limit 1h30m)"),
    ("bench_done", 31, "bench_done for 31m (limit 30m)"),
])
def test_stuck_in_a_state_past_its_timeout(state, minutes, reason):
    r = row("vastctl-1", state=state, state_since=ago(minutes=minutes), bench_rate=68.0)
    actions = plan([r], [seen(r, "loading" if state == "launching" else "running")], SETTINGS, cfg(), NOW)
    assert [(a.kind, a.code, a.reason) for a in actions] == [
        ("kill", f"timeout_{state}", reason), ("destroy", f"timeout_{state}", f"killed: {reason}")]


def test_within_the_timeout_nothing_happens():
    r = row("vastctl-1", state="params_done", state_since=ago(minutes=89))
    assert plan([r], [seen(r)], SETTINGS, cfg(), NOW) == []


def test_timeouts_come_from_the_config():
    r = row("vastctl-1", state="registered", state_since=ago(minutes=6))
    assert kills(plan([r], [seen(r)], SETTINGS, cfg(timeouts={"registered": "5m"}), NOW)) == {
        ("vastctl-1", "timeout_registered")}


def test_running_without_heartbeat():
    r = row("vastctl-1", last_heartbeat_at=ago(minutes=14))
    actions = plan([r], [seen(r)], SETTINGS, cfg(), NOW)
    assert kills(actions) == {("vastctl-1", "heartbeat_timeout")}
    assert actions[0].reason == "no heartbeat for 14m (limit 10m)"
    never = row("vastctl-2", last_heartbeat_at=None, state_since=ago(minutes=12))
    assert plan([never], [seen(never)], SETTINGS, cfg(), NOW)[0].reason == (
        "running for 12m without a heartbeat (limit 10m)")
    fresh = row("vastctl-3", last_heartbeat_at=ago(minutes=30), state_since=ago(minutes=2))  # beat is from before
    assert plan([fresh], [seen(fresh)], SETTINGS, cfg(), NOW) == []


def test_bench_done_below_the_current_gate():
    low = row("vastctl-1", state="bench_done", bench_rate=31.0, state_since=ago(minutes=1))
    ok = row("vastctl-2", state="bench_done", bench_rate=40.0, state_since=ago(minutes=1))
    actions = plan([low, ok], [seen(low), seen(ok)], SETTINGS, cfg(), NOW)
    assert kills(actions) == {("vastctl-1", "bench_failed")}
    assert actions[0].reason.startswith("bench rate 31 below gate 40")
    raised = {**SETTINGS, "min_bench_rate": 45.0}  # the gate is the runtime setting, not the config
    assert kills(plan([low, ok], [seen(low), seen(ok)], raised, cfg(), NOW)) == {
        ("vastctl-1", "bench_failed"), ("vastctl-2", "bench_failed")}


def test_stopped_machines_have_no_timeout():
    r = row("vastctl-1", state="stopped", state_since=ago(days=2), last_heartbeat_at=ago(days=2),
            vast_status="stopped")
    assert plan([r], [seen(r, "stopped", intended_status="stopped")], SETTINGS, cfg(), NOW) == []


def test_one_kill_per_row_the_most_specific_rule_wins():
    r = row("vastctl-1", last_heartbeat_at=ago(hours=1), vast_status="exited", vast_seen_at=ago(minutes=1))
    assert kills(plan([r], [seen(r, "exited")], SETTINGS, cfg(), NOW)) == {("vastctl-1", "exited")}


# --- killed rows, orphans, strangers ------------------------------------------------------------


def test_killed_not_destroyed_is_destroyed_every_pass():
    r = row("vastctl-1", state="killed", kill_code="bench_failed", killed_at=ago(minutes=5), destroy_attempts=3,
            destroy_error="HTTP 500")
    actions = plan([r], [seen(r, "running")], SETTINGS, cfg(), NOW)
    assert [(a.kind, a.label, a.vast_id) for a in actions] == [("destroy", "vastctl-1", 101)]
    assert "attempt 4" in actions[0].reason and "HTTP 500" in actions[0].reason


def test_a_killed_row_keeps_its_code_as_a_kill_code_and_an_unknown_one_is_not_trusted():
    known = row("vastctl-1", state="killed", kill_code="bench_failed", killed_at=ago(minutes=5))
    odd = row("vastctl-2", state="killed", kill_code="typed by hand", killed_at=ago(minutes=5))
    actions = plan([known, odd], [seen(known), seen(odd)], SETTINGS, cfg(), NOW)
    assert [(a.label, a.code) for a in actions] == [("vastctl-1", KillCode.BENCH_FAILED), ("vastctl-2", None)]
    assert "(typed by hand)" in actions[1].reason  # the reason still quotes what the row says


def test_the_kill_codes_are_the_ones_the_interface_names():
    interface = (Path(__file__).parent.parent / "docs" / "interface.md").read_text()
    listed = interface.split("A kill event also carries `code`, one of:")[1].split("(the fleet's")[0]
    assert {code for code in KillCode} == set(re.findall(r"`([a-z_]+)`", listed))
    assert "kill code `tunnel_down`" in interface  # named in the tunnels' section


def test_orphan_with_our_prefix_destroyed_after_the_grace():
    orphan = RemoteInstance(id=555, label="vastctl-lost", actual_status="running")
    assert plan([], [orphan], SETTINGS, cfg(), NOW) == []  # first seen now
    young = {555: ago(minutes=19)}
    assert plan([], [orphan], SETTINGS, cfg(), NOW, first_seen=young) == []
    old = {555: ago(minutes=21)}
    (action,) = plan([], [orphan], SETTINGS, cfg(), NOW, first_seen=old)
    assert (action.kind, action.label, action.vast_id, action.code, action.uuid) == (
        "destroy", "vastctl-lost", 555, "orphan", None)
    assert "listed for 21m (grace 20m)" in action.reason


def test_machines_without_our_prefix_are_never_touched():
    strangers = [
        RemoteInstance(id=1, label="training-job", actual_status="exited"),
        RemoteInstance(id=2, label=None, actual_status="offline"),
        RemoteInstance(id=3, label="VASTCTL-upper", actual_status="running"),
        RemoteInstance(id=4, label="my-vastctl-x", actual_status="running"),
    ]
    first_seen = {i.id: ago(days=30) for i in strangers}
    mine = row("vastctl-1")
    assert plan([mine], [seen(mine), *strangers], SETTINGS, cfg(), NOW, first_seen=first_seen) == []
    custom = cfg(vast={"label_prefix": "prover-"})
    assert plan([], strangers, SETTINGS, custom, NOW, first_seen=first_seen) == []


def test_label_recovers_the_vast_id_of_a_launch_that_crashed_after_create():
    r = row("vastctl-1", state="launching", vast_id=None, state_since=ago(minutes=3), vast_seen_at=None,
            last_heartbeat_at=None, offer_id=7)
    listed = RemoteInstance(id=777, label="vastctl-1", actual_status="loading")
    matched = match([r], [listed])
    assert matched.recovered == {"u-vastctl-1": 777} and matched.unclaimed == []
    # not an orphan, even long after it appeared
    assert plan([r], [listed], SETTINGS, cfg(), NOW, first_seen={777: ago(hours=1)}) == []
    # and once it is stuck, the kill and destroy carry the recovered id
    r["state_since"] = ago(minutes=25)
    actions = plan([r], [listed], SETTINGS, cfg(), NOW)
    assert destroys(actions) == [("vastctl-1", 777)]


def test_a_second_instance_under_one_label_is_an_orphan():
    r = row("vastctl-1", vast_id=101)
    duplicate = RemoteInstance(id=102, label="vastctl-1", actual_status="running")
    (action,) = plan([r], [seen(r), duplicate], SETTINGS, cfg(), NOW, first_seen={102: ago(hours=1)})
    assert (action.vast_id, action.code) == (102, "orphan")


def test_destroyed_but_still_listed_is_destroyed_again():
    listed = RemoteInstance(id=101, label="vastctl-1", actual_status="running")
    gone = {101: {"uuid": "u1", "label": "vastctl-1", "vast_id": 101, "kill_code": "exited",
                  "destroyed_at": ago(minutes=10)}}
    (action,) = plan([], [listed], SETTINGS, cfg(), NOW, history=gone)
    assert (action.kind, action.vast_id, action.uuid) == ("destroy", 101, None)
    assert "still lists" in action.reason
    gone[101]["destroyed_at"] = ago(minutes=1)  # vast may lag a little
    assert plan([], [listed], SETTINGS, cfg(), NOW, history=gone) == []


def test_a_destroyed_row_never_sends_a_destroy_to_an_instance_under_another_label():
    listed = RemoteInstance(id=101, label="train-job", actual_status="running")
    gone = {101: {"uuid": "u1", "label": "vastctl-1", "vast_id": 101, "kill_code": "bench_failed",
                  "destroyed_at": ago(hours=1)}}
    assert plan([], [listed], SETTINGS, cfg(), NOW, history=gone) == []


@pytest.mark.parametrize("status, msg", [("exited", None), ("offline", None), ("stopped", "Error: container stopped")])
def test_status_rules_spare_a_machine_we_stopped(status, msg):
    r = row("vastctl-1", state="stopped", vast_status=status, state_since=ago(hours=3))
    listed = seen(r, status, intended_status="stopped", status_msg=msg)
    assert plan([r], [listed], SETTINGS, cfg(), NOW) == []
    r["vast_missing"] = 1  # but a stopped machine vast no longer has is gone
    assert kills(plan([r, row("vastctl-2"), row("vastctl-3")], [seen(row("vastctl-2")), seen(row("vastctl-3"))],
                      SETTINGS, cfg(), NOW)) == {("vastctl-1", "disappeared")}


def test_a_destroyed_instance_still_listed_is_destroyed_again_unless_vast_unloaded_it():
    gone = row("vastctl-7", state="killed", destroyed_at=ago(minutes=10), kill_code="exited")
    history = {gone["vast_id"]: gone}
    loaded = seen(gone, "exited", cur_state="stopped")
    assert destroys(plan([], [loaded], SETTINGS, cfg(), NOW, history=history)) == [
        ("vastctl-7", gone["vast_id"])]
    unloaded = seen(gone, "exited", cur_state="unloaded")  # vast is taking it down: nothing to ask again
    assert destroys(plan([], [unloaded], SETTINGS, cfg(), NOW, history=history)) == []
    recent = row("vastctl-8", state="killed", destroyed_at=ago(minutes=1), kill_code="exited")
    assert destroys(plan([], [seen(recent, "exited", cur_state="stopped")], SETTINGS, cfg(), NOW,
                         history={recent["vast_id"]: recent})) == []  # within the grace: vast is still catching up


def test_a_machine_the_proof_router_set_aside_is_killed_with_its_own_code_and_blocklisted():
    from vastctl.state import blocklist

    why = "3 calls in a row dropped or failed, the last dropped (route.fail_threshold 3)"
    failing = row("vastctl-1", route_failing_since=ago(seconds=30), route_failure=why)
    earlier = row("vastctl-2", route_failing_since=ago(hours=2), route_failure=why)  # before this spell in running
    (kill,) = [a for a in plan([failing, earlier], [seen(failing), seen(earlier)], SETTINGS, cfg(), NOW)
               if a.kind == "kill"]
    assert (kill.label, kill.code) == ("vastctl-1", KillCode.ROUTE_FAILING)
    assert kill.reason == f"the proof router set it aside 30s ago: {why}"
    killed = {**failing, "state": "killed", "kill_code": "route_failing", "killed_at": ago(seconds=1)}
    assert blocklist.reason_for(killed) == f"failed the proof router's calls ({why})"


# --- tunnel_down: a running machine the manager cannot reach through its tunnel -----------------------------


def tunneled(label: str, **fields) -> dict:
    """A running machine with a tunnel that joined in this spell in `running` (state_since 1h ago)."""
    return row(label, **{"tunnel_port": 20001, "joined_at": ago(minutes=50), "tunnel_down_since": None, **fields})


def test_a_joined_machine_unreachable_past_the_timeout_is_killed_tunnel_down():
    down = tunneled("vastctl-1", tunnel_down_since=ago(minutes=11))
    (kill,) = [a for a in plan([down], [seen(down)], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert (kill.label, kill.code) == ("vastctl-1", KillCode.TUNNEL_DOWN)
    assert kill.reason == "unreachable through its tunnel (127.0.0.1:20001) for 11m (limit 10m)"


def test_a_machine_that_never_joined_this_run_counts_from_running():
    never = tunneled("vastctl-1", joined_at=None)
    earlier = tunneled("vastctl-2", joined_at=ago(hours=2))  # joined before this spell in running: not now
    actions = plan([never, earlier], [seen(never), seen(earlier)], SETTINGS, cfg(), NOW)
    assert kills(actions) == {("vastctl-1", KillCode.TUNNEL_DOWN), ("vastctl-2", KillCode.TUNNEL_DOWN)}
    assert {a.reason for a in actions if a.kind == "kill"} == {
        "never reached through its tunnel (127.0.0.1:20001) for 1h (limit 10m)"}


def test_a_tunnel_down_within_the_timeout_or_no_tunnel_at_all_is_left_alone():
    rows = [tunneled("vastctl-1", tunnel_down_since=ago(minutes=9)),  # within the default 10m
            tunneled("vastctl-2"),  # joined, up
            row("vastctl-3", tunnel_port=None, tunnel_down_since=ago(hours=1), joined_at=None),  # no tunnel
            tunneled("vastctl-4", state="stopped", tunnel_down_since=ago(hours=1))]  # not running
    assert kills(plan(rows, [seen(r) for r in rows], SETTINGS, cfg(), NOW)) == set()


def test_the_tunnel_timeout_comes_from_the_config():
    down = tunneled("vastctl-1", tunnel_down_since=ago(minutes=11))
    assert kills(plan([down], [seen(down)], SETTINGS, cfg(tunnel={"down_timeout": "30m"}), NOW)) == set()
    assert kills(plan([down], [seen(down)], SETTINGS, cfg(tunnel={"down_timeout": "5m"}), NOW)) == {
        ("vastctl-1", KillCode.TUNNEL_DOWN)}


def test_a_missed_heartbeat_wins_over_a_down_tunnel():
    both = tunneled("vastctl-1", tunnel_down_since=ago(minutes=30), last_heartbeat_at=ago(minutes=30))
    assert kills(plan([both], [seen(both)], SETTINGS, cfg(), NOW)) == {("vastctl-1", KillCode.HEARTBEAT_TIMEOUT)}


# --- the destroy of a killed row: its reason and its fields, exactly ---------------------------------------


def test_a_killed_rows_destroy_names_its_age_code_and_the_last_error():
    r = row("vastctl-1", state="killed", kill_code="operator", killed_at=ago(minutes=5), destroy_attempts=2,
            destroy_error="HTTP 500", state_since=ago(hours=3))
    (destroy,) = plan([r], [seen(r)], SETTINGS, cfg(), NOW)
    assert (destroy.kind, destroy.actor, destroy.label, destroy.uuid, destroy.vast_id, destroy.code) == (
        "destroy", "reconcile", "vastctl-1", "u-vastctl-1", 101, KillCode.OPERATOR)
    assert destroy.reason == "killed 5m ago (operator), not yet destroyed; attempt 3, last error: HTTP 500"


def test_a_first_destroy_says_no_attempt_and_a_row_without_killed_at_counts_from_its_state():
    first = row("vastctl-1", state="killed", kill_code=None, killed_at=None, state_since=ago(minutes=7))
    again = row("vastctl-2", state="killed", kill_code="agent", killed_at=ago(minutes=2), destroy_attempts=1,
                destroy_error=None)
    reasons = {a.label: (a.reason, a.code) for a in plan([first, again], [seen(first), seen(again)], SETTINGS, cfg(), NOW)}
    assert reasons == {"vastctl-1": ("killed 7m ago (no code), not yet destroyed", None),
                       "vastctl-2": ("killed 2m ago (agent), not yet destroyed; attempt 2, last error: ?", KillCode.AGENT)}


def test_stored_code_reads_a_known_code_and_leaves_out_the_rest():
    from vastctl.reconcile.decide import stored_code

    assert stored_code("tunnel_down") is KillCode.TUNNEL_DOWN and stored_code(None) is None
    assert stored_code("typed by hand") is None and stored_code("") is None


# --- the rules' edges: counts, boundaries and the words of each reason ------------------------------------


def test_missing_after_counts_this_listing_only_for_a_row_vast_should_list():
    from vastctl.reconcile.decide import missing_after

    listed = row("vastctl-1", vast_missing=3)
    gone = row("vastctl-2", vast_missing=None)
    gone_again = row("vastctl-3", vast_missing=2)
    fresh = row("vastctl-4", state="launching", vast_id=None, vast_seen_at=None, vast_missing=2)  # not yet listed
    matched = match([listed, gone, gone_again, fresh], [seen(listed)])
    assert [missing_after(r, matched) for r in (listed, gone, gone_again, fresh)] == [0, 1, 3, 2]


def test_one_confirmation_kills_a_vanished_machine_at_its_first_miss():
    rows = [row(f"vastctl-{n}", vast_seen_at=ago(minutes=3)) for n in range(4)]
    one = cfg(reconcile={"disappear_confirmations": 1, "confirm_after": 0})
    assert kills(plan(rows, [seen(r) for r in rows[1:]], SETTINGS, one, NOW)) == {("vastctl-0", "disappeared")}


def test_a_vanished_machine_never_seen_says_so():
    rows = [row("vastctl-0", vast_missing=1, vast_seen_at=None, vast_missing_since=ago(minutes=3),
                last_heartbeat_at=ago(minutes=3))] + [
        row(f"vastctl-{n}") for n in range(1, 4)]
    (kill,) = [a for a in plan(rows, [seen(r) for r in rows[1:]], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert kill.reason == "disappeared from vast: instance 100 missing from 2 consecutive listings, never seen"


def test_a_start_failure_counts_only_off_a_running_status_and_names_a_missing_one():
    text = START_FAILURE_TEXTS[0]
    r = row("vastctl-1")
    assert plan([r], [seen(r, "running", status_msg=text)], SETTINGS, cfg(), NOW) == []
    (kill,) = [a for a in plan([r], [seen(r, None, status_msg=text)], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert kill.code == KillCode.START_FAILED and kill.reason.startswith("vast reports a start failure (status none): ")
    from vastctl.reconcile.decide import start_failure

    assert start_failure(None) is None and start_failure("") is None and start_failure("   ") is None


def test_a_dead_status_reason_quotes_vasts_text_bounded_or_nothing():
    r = row("vastctl-1", vast_status="exited", vast_seen_at=ago(minutes=3))
    (plain,) = [a for a in plan([r], [seen(r, "exited")], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert plain.reason == "vast status exited for 3m (2 listings)"
    (quoted,) = [a for a in plan([r], [seen(r, "exited", status_msg="x" * 400)], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert quoted.reason == "vast status exited for 3m (2 listings): " + "x" * 159 + "…"


def test_a_resumed_machine_is_stuck_only_past_five_minutes_whatever_it_intends_or_says():
    def stuck(minutes, seconds=0, status="stopped", intended="running"):
        r = row("vastctl-1", state="launching", resumed_at=ago(minutes=minutes, seconds=seconds),
                state_since=ago(minutes=minutes, seconds=seconds), vast_status=status, last_heartbeat_at=None)
        return [a for a in plan([r], [seen(r, status, intended_status=intended)], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert stuck(5) == [] and len(stuck(5, seconds=1)) == 1
    assert [a.code for a in stuck(6, intended="")] == [KillCode.SCHEDULING_TIMEOUT]  # no intent said: running's
    assert stuck(6, intended="stopped") == []  # vast was asked to stop it
    (unsaid,) = stuck(6, status=None)
    assert unsaid.reason == ("resumed 6m ago but vast still has it unscheduled (limit 5m): its GPU is likely taken")


def test_only_a_row_still_in_bench_done_is_judged_by_the_gate():
    running = row("vastctl-1", bench_rate=30.0)  # passed an older, lower gate and proves: not re-judged
    assert plan([running], [seen(running)], SETTINGS, cfg(), NOW) == []


def test_a_state_at_its_timeout_exactly_is_not_over_it():
    at_limit = row("vastctl-1", state="params_done", state_since=ago(minutes=90))
    assert plan([at_limit], [seen(at_limit)], SETTINGS, cfg(), NOW) == []


def outbid_listing(r, **fields):
    return seen(r, "stopped", raw={"is_bid": True}, **fields)


def test_an_outbid_machine_is_waited_for_two_hours_after_its_last_heartbeat():
    paused = row("vastctl-1", last_heartbeat_at=ago(minutes=30), vast_status="stopped")
    assert plan([paused], [outbid_listing(paused)], SETTINGS, cfg(), NOW) == []
    stamped = row("vastctl-2", last_heartbeat_at=ago(minutes=30), outbid_since=ago(minutes=25))  # listed running again
    assert plan([stamped], [seen(stamped)], SETTINGS, cfg(), NOW) == []
    long_gone = row("vastctl-3", last_heartbeat_at=ago(hours=2, seconds=1), vast_status="stopped")
    assert kills(plan([long_gone], [outbid_listing(long_gone)], SETTINGS, cfg(), NOW)) == {
        ("vastctl-3", KillCode.HEARTBEAT_TIMEOUT)}
    silent = row("vastctl-4", last_heartbeat_at=None, vast_status="stopped", state_since=ago(minutes=20))
    assert kills(plan([silent], [outbid_listing(silent)], SETTINGS, cfg(), NOW)) == {
        ("vastctl-4", KillCode.HEARTBEAT_TIMEOUT)}  # never heartbeated: nothing to wait from


def test_outbid_is_a_bidding_instance_vast_lists_stopped():
    from vastctl.reconcile.decide import outbid

    assert outbid(RemoteInstance(id=1, actual_status="stopped", raw={"is_bid": True}))
    assert outbid(RemoteInstance(id=1, actual_status="running", cur_state="stopped", raw={"is_bid": True}))
    assert not outbid(RemoteInstance(id=1, actual_status="running", cur_state="running", raw={"is_bid": True}))
    assert not outbid(RemoteInstance(id=1, actual_status="stopped", raw={"is_bid": False}))
    assert not outbid(RemoteInstance(id=1, actual_status="stopped", raw={"is_bid": "true"}))  # only vast's true
    assert not outbid(RemoteInstance(id=1, actual_status="stopped"))


# --- the pairing of rows and listing entries ----------------------------------------------------------------


def test_a_row_is_paired_by_its_vast_id_whatever_the_label_vast_shows():
    r = row("vastctl-1")
    relabelled = RemoteInstance(id=101, label="renamed-by-hand", actual_status="running")
    matched = match([r], [relabelled], "vastctl-")
    assert matched.by_uuid == {"u-vastctl-1": relabelled} and matched.unclaimed == [] and matched.recovered == {}


def test_an_instance_paired_by_id_is_not_paired_again_by_label():
    by_id = row("vastctl-1", offer_id=7)
    crashed = row("vastctl-1", vast_id=None, offer_id=7, state="launching", vast_seen_at=None)
    crashed["uuid"] = "u-crashed"
    listed = RemoteInstance(id=101, label="vastctl-1", actual_status="running")
    matched = match([by_id, crashed], [listed], "vastctl-")
    assert matched.by_uuid == {"u-vastctl-1": listed} and matched.recovered == {} and matched.unclaimed == []


def test_a_row_without_an_id_takes_its_claimed_id_else_the_lowest_under_its_label():
    claimed = row("vastctl-1", vast_id=None, offer_id=7, claimed_vast_id=105)
    unclaimed = row("vastctl-2", vast_id=None, offer_id=7)
    listing = [RemoteInstance(id=105, label="vastctl-1"), RemoteInstance(id=103, label="vastctl-1"),
               RemoteInstance(id=209, label="vastctl-2"), RemoteInstance(id=207, label="vastctl-2")]
    matched = match([claimed, unclaimed], listing, "vastctl-")
    assert matched.recovered == {"u-vastctl-1": 105, "u-vastctl-2": 207}
    assert matched.by_uuid == {"u-vastctl-1": listing[0], "u-vastctl-2": listing[3]}
    assert [e.id for e in matched.unclaimed] == [103, 209]


def test_an_adopted_row_is_paired_by_label_only_with_our_prefix_and_the_next_row_still_is():
    stranger = row("train-1", vast_id=None, offer_id=None)  # adopted by register, a label we never act on
    adopted = row("vastctl-9", vast_id=None, offer_id=None)
    unlisted = row("vastctl-8", vast_id=None, offer_id=7, state="launching")  # its label is not listed
    listing = [RemoteInstance(id=301, label="train-1"), RemoteInstance(id=309, label="vastctl-9")]
    matched = match([stranger, unlisted, adopted], listing, "vastctl-")
    assert matched.recovered == {"u-vastctl-9": 309} and [e.id for e in matched.unclaimed] == [301]
    assert match([adopted], listing).recovered == {}  # no prefix: nothing is ours to adopt
    # plan pairs with the configured prefix: the adopted machine's instance is no orphan
    assert plan([adopted], listing[1:], SETTINGS, cfg(), NOW, first_seen={309: ago(hours=2)}) == []


def test_whether_vast_should_list_a_row_decides_if_its_miss_counts():
    from vastctl.reconcile.decide import missing_after

    never_seen = row("vastctl-1", vast_seen_at=None)  # running with an id: vast should list it
    seen_launch = row("vastctl-2", state="launching", vast_seen_at=ago(minutes=1))  # listed before: should be
    no_id = row("vastctl-3", vast_id=None, vast_missing=2)  # nothing to look for: the count stays
    matched = match([never_seen, seen_launch, no_id], [])
    assert [missing_after(r, matched) for r in (never_seen, seen_launch, no_id)] == [1, 1, 2]


def test_a_distrusted_listing_names_five_of_the_vanished_and_what_to_do():
    rows = [row(f"vastctl-{n}") for n in range(12)]
    with pytest.raises(ListingDistrusted) as caught:
        plan(rows, [seen(r) for r in rows[6:]], SETTINGS, cfg(reconcile={"max_vanish_fraction": 0.25}), NOW)
    assert str(caught.value) == (
        "vast listing distrusted: 6 of 12 live machines vanished at once (vastctl-0, vastctl-1, vastctl-2,"
        " vastctl-3, vastctl-4, …; max_vanish_fraction 0.25); nothing was killed. If they really are gone, kill"
        " them with `vastctl kill LABEL --reason …`; otherwise retry later")
    with pytest.raises(ListingDistrusted, match=r"\(vastctl-1, vastctl-2, vastctl-3, vastctl-4, vastctl-5; max"):
        plan(rows[1:], [seen(r) for r in rows[6:]], SETTINGS, cfg(reconcile={"max_vanish_fraction": 0.25}), NOW)


# --- the actions a pass plans, whole ------------------------------------------------------------------------


def test_a_kill_and_its_destroy_carry_every_field_and_the_rows_state_as_their_precondition():
    from vastctl.guard import Action, Kind

    r = row("vastctl-1", last_heartbeat_at=ago(minutes=14))
    reason = "no heartbeat for 14m (limit 10m)"
    kill, destroy = plan([r], [seen(r)], SETTINGS, cfg(), NOW)
    assert kill == Action(kind=Kind.KILL, actor="reconcile", label="vastctl-1", reason=reason, uuid="u-vastctl-1",
                          vast_id=101, code=KillCode.HEARTBEAT_TIMEOUT)
    assert kill.expect == ("running", r["state_since"], r["last_heartbeat_at"])
    assert destroy == Action(kind=Kind.DESTROY, actor="reconcile", label="vastctl-1", reason=f"killed: {reason}",
                             uuid="u-vastctl-1", vast_id=101, code=KillCode.HEARTBEAT_TIMEOUT)


def test_a_killed_row_already_destroyed_needs_nothing_and_the_rows_after_it_are_still_judged():
    done = row("vastctl-1", state="killed", kill_code="operator", killed_at=ago(hours=1), destroyed_at=ago(minutes=50))
    dead = row("vastctl-2", last_heartbeat_at=ago(minutes=14))
    actions = plan([done, dead], [seen(done), seen(dead)], SETTINGS, cfg(), NOW)
    assert [(a.kind, a.label) for a in actions] == [("kill", "vastctl-2"), ("destroy", "vastctl-2")]
    undestroyed = {**done, "destroyed_at": None}
    actions = plan([undestroyed, dead], [seen(done), seen(dead)], SETTINGS, cfg(), NOW)
    assert [(a.kind, a.label) for a in actions] == [("destroy", "vastctl-1"), ("kill", "vastctl-2"),
                                                    ("destroy", "vastctl-2")]


def test_a_heartbeat_at_the_moment_it_entered_running_counts_as_one():
    r = row("vastctl-1", state_since=ago(minutes=15), last_heartbeat_at=ago(minutes=15))
    assert [a.reason for a in plan([r], [seen(r)], SETTINGS, cfg(), NOW) if a.kind == "kill"] == [
        "no heartbeat for 15m (limit 10m)"]


def test_a_tunnel_down_for_exactly_its_timeout_is_not_over_it():
    down = tunneled("vastctl-1", tunnel_down_since=ago(minutes=10))
    assert kills(plan([down], [seen(down)], SETTINGS, cfg(), NOW)) == set()


def test_the_router_setting_a_machine_aside_as_it_entered_running_counts_and_its_words_are_bounded():
    at_start = row("vastctl-1", route_failing_since=ago(hours=1), route_failure=None)  # state_since 1h ago too
    (kill,) = [a for a in plan([at_start], [seen(at_start)], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert kill.code == KillCode.ROUTE_FAILING and kill.reason == "the proof router set it aside 1h ago: no detail"
    wordy = row("vastctl-2", route_failing_since=ago(seconds=30), route_failure="y" * 400)
    (kill,) = [a for a in plan([wordy], [seen(wordy)], SETTINGS, cfg(), NOW) if a.kind == "kill"]
    assert kill.reason == "the proof router set it aside 30s ago: " + "y" * 159 + "…"


# --- listed instances no row claims ---------------------------------------------------------------------------


def test_a_destroyed_instance_still_listed_is_destroyed_again_with_its_code_and_words():
    from vastctl.guard import Action, Kind

    listed = RemoteInstance(id=101, label="vastctl-1", actual_status=None)
    gone = {101: {"uuid": "u1", "label": "vastctl-1", "vast_id": 101, "kill_code": "exited",
                  "destroyed_at": ago(minutes=10)}}
    (action,) = plan([], [listed], SETTINGS, cfg(), NOW, history=gone)
    assert action == Action(kind=Kind.DESTROY, actor="reconcile", label="vastctl-1", vast_id=101, code=KillCode.EXITED,
                            reason="destroyed 10m ago but vast still lists instance 101 (no status)")
    gone[101]["destroyed_at"] = ago(minutes=5)  # exactly the grace: not yet
    assert plan([], [listed], SETTINGS, cfg(), NOW, history=gone) == []


def test_an_orphan_is_destroyed_whole_past_its_grace_not_at_it_and_after_any_other_entry():
    from vastctl.guard import Action, Kind

    lagging = RemoteInstance(id=101, label="vastctl-1", actual_status="running")  # destroyed a minute ago
    stranger = RemoteInstance(id=200, label="train-job", actual_status="running")
    orphan = RemoteInstance(id=555, label="vastctl-lost", actual_status="running")
    history = {101: {"uuid": "u1", "label": "vastctl-1", "vast_id": 101, "kill_code": None,
                     "destroyed_at": ago(minutes=1)}}
    first_seen = {555: ago(minutes=21), 200: ago(days=3)}
    actions = plan([], [lagging, stranger, orphan], SETTINGS, cfg(), NOW, first_seen=first_seen, history=history)
    assert actions == [Action(kind=Kind.DESTROY, actor="reconcile", label="vastctl-lost", vast_id=555,
                              code=KillCode.ORPHAN, reason="orphan: vast instance 555 carries our prefix but has no"
                              " row and never registered; listed for 21m (grace 20m)")]
    assert plan([], [orphan], SETTINGS, cfg(), NOW, first_seen={555: ago(minutes=20)}) == []  # at the grace


def test_a_healthy_row_before_a_dead_one_does_not_hide_it():
    healthy, dead = row("vastctl-1"), row("vastctl-2", last_heartbeat_at=ago(minutes=14))
    assert kills(plan([healthy, dead], [seen(healthy), seen(dead)], SETTINGS, cfg(), NOW)) == {
        ("vastctl-2", KillCode.HEARTBEAT_TIMEOUT)}


def test_an_outbid_machine_silent_for_exactly_two_hours_is_timed_out():
    paused = row("vastctl-1", last_heartbeat_at=ago(hours=2), vast_status="stopped")
    assert kills(plan([paused], [outbid_listing(paused)], SETTINGS, cfg(), NOW)) == {
        ("vastctl-1", KillCode.HEARTBEAT_TIMEOUT)}


def test_a_destroy_error_quoted_into_the_reason_is_bounded():
    r = row("vastctl-1", state="killed", kill_code="operator", killed_at=ago(minutes=5), destroy_attempts=1,
            destroy_error="z" * 400)
    (destroy,) = plan([r], [seen(r)], SETTINGS, cfg(), NOW)
    assert destroy.reason == "killed 5m ago (operator), not yet destroyed; attempt 2, last error: " + "z" * 159 + "…"


def test_a_row_vast_need_not_list_keeps_a_zero_count():
    from vastctl.reconcile.decide import missing_after

    fresh = row("vastctl-4", state="launching", vast_id=None, vast_seen_at=None, vast_missing=0)
    assert missing_after(fresh, match([fresh], [])) == 0
    assert missing_after({**fresh, "vast_missing": None}, match([fresh], [])) == 0
