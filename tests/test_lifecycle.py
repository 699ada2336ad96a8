"""lifecycle: every allowed and refused move, the reports' semantics, one event per real change."""

from __future__ import annotations

from datetime import timedelta

import pytest

from vastctl import clock, validate
from vastctl.cli import said
from vastctl.errors import BadInput, BenchFailed, Refused, UnknownInstance
from vastctl.state import lifecycle, rates
from vastctl.state.lifecycle import ALLOWED, KillCode, State

T0 = clock.from_iso("2026-11-30T00:00:00Z")


def make(conn, state: State, uuid="u1", label="vastctl-u1"):
    return lifecycle.create(conn, uuid=uuid, label=label, state=state, reason="test", source="operator", now=T0)


def events(conn):
    return [dict(r) for r in conn.execute("SELECT * FROM events ORDER BY id")]


ALL_MOVES = [(a, b) for a in State for b in State]


def move(conn, to_state, now):
    """A move to `to_state` as the package makes it: a kill through kill(), with its code; any other through
    transition()."""
    if to_state is State.KILLED:
        return lifecycle.kill(conn, "u1", "why", source="operator", code=KillCode.OPERATOR, now=now)
    return lifecycle.transition(conn, "u1", to_state, "why", "operator", now=now)


@pytest.mark.parametrize("from_state,to_state", ALL_MOVES, ids=[f"{a}->{b}" for a, b in ALL_MOVES])
def test_every_move_is_allowed_or_refused_per_table(conn, from_state, to_state):
    make(conn, from_state)
    before = events(conn)
    if to_state in ALLOWED[from_state]:
        row = move(conn, to_state, T0 + timedelta(minutes=1))
        assert row["state"] == to_state
        after = events(conn)
        assert len(after) == len(before) + 1
        assert after[-1]["from_state"] == from_state and after[-1]["to_state"] == to_state
        assert after[-1]["label"] == "vastctl-u1" and after[-1]["reason"] == "why"
        assert row["state_since"] == clock.to_iso(T0 + timedelta(minutes=1))
    else:
        with pytest.raises(Refused, match=f"is {from_state}; it cannot go to {to_state}"):
            move(conn, to_state, T0)
        assert events(conn) == before
        assert lifecycle.get(conn, "u1")["state"] == from_state


def test_killed_is_terminal_and_every_live_state_can_be_killed():
    assert ALLOWED[State.KILLED] == frozenset()
    assert all(State.KILLED in ALLOWED[s] for s in lifecycle.LIVE_STATES)


def test_transition_of_unknown_uuid_is_bad_input(conn):
    with pytest.raises(UnknownInstance):
        lifecycle.kill(conn, "nope", "x", source="operator", code=KillCode.OPERATOR, now=T0)
    with pytest.raises(UnknownInstance):
        lifecycle.transition(conn, "nope", State.RUNNING, "x", "operator", now=T0)
    assert events(conn) == []


@pytest.mark.parametrize("from_state", sorted(lifecycle.LIVE_STATES))
def test_transition_never_kills_a_kill_goes_through_kill_with_its_code(conn, from_state):
    make(conn, from_state)
    before = events(conn)
    with pytest.raises(ValueError, match=r"killed through lifecycle.kill\(\)"):
        lifecycle.transition(conn, "u1", State.KILLED, "why", "operator", now=T0)
    assert lifecycle.get(conn, "u1")["state"] == from_state and events(conn) == before


def test_a_kill_code_no_killcode_names_is_refused_and_nothing_changes(conn):
    make(conn, State.RUNNING)
    before = events(conn)
    with pytest.raises(ValueError, match="not_a_code"):
        lifecycle.kill(conn, "u1", "why", source="operator", code="not_a_code", now=T0)
    assert lifecycle.get(conn, "u1")["state"] == "running" and events(conn) == before


def test_kill_records_reason_code_and_time(conn):
    make(conn, State.RUNNING)
    row = lifecycle.kill(conn, "u1", "no heartbeat for 12m", source="reconcile", code=KillCode.HEARTBEAT_TIMEOUT, now=T0)
    assert (row["state"], row["kill_reason"], row["kill_code"]) == ("killed", "no heartbeat for 12m", "heartbeat_timeout")
    assert row["killed_at"] == clock.to_iso(T0)
    assert events(conn)[-1]["code"] == "heartbeat_timeout" and events(conn)[-1]["source"] == "reconcile"


def test_second_kill_is_refused_and_makes_no_event(conn):
    make(conn, State.RUNNING)
    lifecycle.kill(conn, "u1", "first", source="instance", code=KillCode.BENCH_FAILED, now=T0)
    with pytest.raises(Refused):
        lifecycle.kill(conn, "u1", "second", source="reconcile", code=KillCode.EXITED, now=T0)
    assert [e["reason"] for e in events(conn) if e["to_state"] == "killed"] == ["first"]
    assert lifecycle.get(conn, "u1")["kill_reason"] == "first"


def test_register_unknown_uuid_adopts_it(conn):
    row = lifecycle.register(conn, "u9", label="hand-made", vast_id=42, gpu_name="RTX 4090", num_gpus=1, now=T0)
    assert (row["state"], row["label"], row["gpu_name"]) == ("registered", "hand-made", "RTX 4090")
    assert (row["vast_id"], row["claimed_vast_id"]) == (None, 42)  # a claim until vast lists it under its label
    (event,) = events(conn)
    assert event["from_state"] is None and event["to_state"] == "registered" and "adopted" in event["reason"]


def test_register_unknown_uuid_needs_a_label(conn):
    with pytest.raises(BadInput) as caught:
        lifecycle.register(conn, "u9", now=T0)
    assert said(caught.value) == "instance u9 is new here: register it with --label"
    assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] == 0


def test_register_refuses_a_label_that_belongs_to_another_machine(conn):
    make(conn, State.RUNNING, uuid="u1", label="vastctl-a")
    with pytest.raises(BadInput, match="already belongs"):
        lifecycle.register(conn, "u2", label="vastctl-a", now=T0)


def test_register_after_launch_moves_to_registered(conn):
    make(conn, State.LAUNCHING)
    row = lifecycle.register(conn, "u1", gpu_name="RTX 5090", now=T0)
    assert row["state"] == "registered" and row["gpu_name"] == "RTX 5090" and row["restarts"] == 0
    assert events(conn)[-1]["reason"] == "boot script started"


@pytest.mark.parametrize("state", [State.PARAMS_DONE, State.BENCH_DONE, State.RUNNING])
def test_register_of_a_live_row_records_a_restart(conn, state):
    make(conn, state)
    row = lifecycle.register(conn, "u1", now=T0)
    assert row["state"] == "registered" and row["restarts"] == 1
    assert events(conn)[-1]["reason"] == f"container restarted (was {state})"


def test_register_twice_is_one_event(conn):
    lifecycle.register(conn, "u1", label="a", now=T0)
    lifecycle.register(conn, "u1", label="a", vast_id=7, now=T0)
    assert len(events(conn)) == 1
    assert lifecycle.get(conn, "u1")["claimed_vast_id"] == 7


def test_a_machine_never_changes_the_vast_id_its_launch_recorded(conn):
    lifecycle.create(conn, uuid="u1", label="vastctl-u1", state=State.LAUNCHING, reason="t", source="operator",
                     fields={"vast_id": 100, "offer_id": 7}, now=T0)
    row = lifecycle.register(conn, "u1", vast_id=555, now=T0)
    assert (row["state"], row["vast_id"], row["claimed_vast_id"]) == ("registered", 100, 555)
    row = lifecycle.register(conn, "u1", vast_id=556, now=T0)  # a repeated report, still only a claim
    assert (row["vast_id"], row["claimed_vast_id"]) == (100, 556)


def test_a_launched_machine_cannot_re_say_the_gpu_its_offer_recorded(conn):
    lifecycle.create(conn, uuid="u1", label="vastctl-u1", state=State.LAUNCHING, reason="t", source="operator",
                     fields={"vast_id": 100, "offer_id": 7, "gpu_name": "RTX 4090", "num_gpus": 1}, now=T0)
    row = lifecycle.register(conn, "u1", gpu_name="RTX 5090", num_gpus=8, now=T0)
    assert (row["state"], row["gpu_name"], row["num_gpus"]) == ("registered", "RTX 4090", 1)
    adopted = lifecycle.register(conn, "u2", label="vastctl-u2", gpu_name="RTX 5090", num_gpus=2, now=T0)
    assert (adopted["gpu_name"], adopted["num_gpus"]) == ("RTX 5090", 2)  # no offer: its report is all we know


def test_register_of_a_killed_row_is_refused(conn):
    make(conn, State.KILLED)
    with pytest.raises(Refused, match="was killed"):
        lifecycle.register(conn, "u1", now=T0)
    assert lifecycle.get(conn, "u1")["state"] == "killed"


def test_bench_at_the_gate_passes(conn):
    make(conn, State.PARAMS_DONE)
    row = rates.bench_report(conn, "u1", 40.0, gate=40.0, now=T0)
    assert (row["state"], row["bench_rate"]) == ("bench_done", 40.0)


def test_bench_below_the_gate_kills_with_rate_and_gate_in_the_reason(conn):
    make(conn, State.PARAMS_DONE)
    with pytest.raises(BenchFailed) as failure:
        rates.bench_report(conn, "u1", 3.1, gate=10, now=T0)
    assert failure.value.exit_code == 5
    row = lifecycle.get(conn, "u1")
    assert (row["state"], row["kill_code"], row["bench_rate"]) == ("killed", "bench_failed", 3.1)
    assert row["kill_reason"] == "bench rate 3.1 below gate 10"


@pytest.mark.parametrize("rate", [True, "abc", -1, float("nan"), float("inf"), "-inf", None])
def test_bad_rates_are_bad_input_by_the_one_rate_check(rate):
    """bench_report takes a rate this passed; that nothing changes for a bad one is tested where it enters (a
    command line: test_cli_instance; an HTTP body: test_server)."""
    with pytest.raises(BadInput):
        rates.validate_rate(rate)


@pytest.mark.parametrize("rate,state", [(50.0, "bench_done"), (5.0, "killed")])
def test_a_repeated_bench_report_answers_the_same_without_a_second_event(conn, rate, state):
    make(conn, State.PARAMS_DONE)
    for _ in range(3):
        try:
            row = rates.bench_report(conn, "u1", rate, gate=10, now=T0)
        except BenchFailed as failure:
            row = failure.row
        assert row["state"] == state
    assert len(events(conn)) == 2


def test_bench_report_from_registered_is_refused(conn):
    make(conn, State.REGISTERED)
    with pytest.raises(Refused):
        rates.bench_report(conn, "u1", 50, gate=10, now=T0)


def test_params_done_and_running_are_idempotent(conn):
    make(conn, State.REGISTERED)
    lifecycle.params_done(conn, "u1", now=T0)
    lifecycle.params_done(conn, "u1", now=T0)
    rates.bench_report(conn, "u1", 50, gate=10, now=T0)
    lifecycle.running(conn, "u1", now=T0)
    lifecycle.running(conn, "u1", now=T0)
    assert [e["to_state"] for e in events(conn)] == ["registered", "params_done", "bench_done", "running"]


def test_heartbeat_is_not_an_event_and_keeps_liveness(conn):
    make(conn, State.RUNNING)
    row = rates.heartbeat(conn, "u1", proofs_done=3, now=T0)
    assert row["last_heartbeat_at"] == clock.to_iso(T0) and row["proofs_done"] == 3
    assert len(events(conn)) == 1


def test_heartbeat_rate_follows_the_counter(conn):
    make(conn, State.RUNNING)
    for minute in range(0, 121, 10):  # no benchmark to start from: the first rate needs a 10-minute window
        rates.heartbeat(conn, "u1", proofs_done=minute, now=T0 + timedelta(minutes=minute))
    assert lifecycle.get(conn, "u1")["proofs_per_hour"] == pytest.approx(60.0, rel=1e-6)


def test_heartbeat_counter_reset_does_not_go_negative(conn):
    make(conn, State.RUNNING)
    rates.heartbeat(conn, "u1", proofs_done=100, now=T0)
    rates.heartbeat(conn, "u1", proofs_done=110, now=T0 + timedelta(minutes=10))
    row = rates.heartbeat(conn, "u1", proofs_done=2, now=T0 + timedelta(minutes=20))
    assert row["proofs_per_hour"] == pytest.approx(60.0) and row["proofs_done"] == 2


def test_heartbeat_of_a_killed_row_is_refused(conn):
    make(conn, State.KILLED)
    with pytest.raises(Refused):
        rates.heartbeat(conn, "u1", proofs_done=1, now=T0)
    assert lifecycle.get(conn, "u1")["last_heartbeat_at"] is None


def test_heartbeat_rejects_a_negative_count():
    """By the one count check, where it enters (heartbeat takes a count this passed; a command line's and an HTTP
    body's refusals, nothing changed, are tested in test_cli_instance and test_server)."""
    with pytest.raises(BadInput):
        rates.validate_proofs(-1)


def test_resolve_by_label_or_uuid(conn):
    make(conn, State.RUNNING, uuid="u1", label="vastctl-a")
    assert lifecycle.resolve(conn, "vastctl-a")["uuid"] == "u1"
    assert lifecycle.resolve(conn, "u1")["label"] == "vastctl-a"
    with pytest.raises(UnknownInstance):
        lifecycle.resolve(conn, "vastctl-zzz")


@pytest.mark.parametrize("value", ["vastctl-a", "RTX 4090", "Ünïcödé-名前", "x" * 256, "a b"])
def test_validate_text_accepts_printable_identifiers(value):
    assert validate.text(value, "label") == value


@pytest.mark.parametrize("value,why", [
    ("", "got an empty value"), ("x" * 257, "got 257 characters"), ("a\x00b", "\\x00 (character 2)"),
    ("a\x7f", "\\x7f"), ("\x85", "\\x85"), ("abc\u202e", "\\u202e (character 4)"), ("\u2067x", "\\u2067"),
    ("a\u2028", "\\u2028"), ("a\u2029", "\\u2029"), ("\ufeffa", "\\ufeff"), ("a\ud800", "\\ud800"),
    ("a\u200bb", "\\u200b"), ("a\nb", "\\n (character 2)"),
])
def test_validate_text_refuses_control_bidi_and_separators_without_echoing_them(value, why):
    with pytest.raises(BadInput, match="label must be 1 to 256 printable") as caught:
        validate.text(value, "label")
    assert why in str(caught.value)
    assert lifecycle.printable(str(caught.value)) == str(caught.value)  # the message itself is safe to print


@pytest.mark.parametrize("value", [None, 5, ["a"], b"bytes"])
def test_validate_text_refuses_what_is_not_text(value):
    with pytest.raises(BadInput) as caught:
        validate.text(value, "gpu_name")
    assert said(caught.value).startswith("--gpu must be text, got ")


def test_printable_escapes_only_what_hides():
    assert lifecycle.printable("RTX 4090 · 名前") == "RTX 4090 · 名前"
    assert lifecycle.printable("a\x1b[2Jb\u202ec\td\x9b") == "a\\x1b[2Jb\\u202ec\\td\\x9b"


@pytest.mark.parametrize("value", [-1, 2**63, True, 1.5, "3"])
def test_proofs_done_must_fit_the_file(value):
    with pytest.raises(BadInput) as caught:
        rates.validate_proofs(value)
    assert said(caught.value).startswith("--proofs-done must be a whole number from 0 to 9223372036854775807")
    assert rates.validate_proofs(2**63 - 1) == 2**63 - 1


@pytest.mark.parametrize("field,value,flag", [
    ("gpu_name", "RTX\n4090", "--gpu"), ("gpu_name", "G" * 257, "--gpu"), ("label", "a\u202eb", "--label"),
    ("vast_id", 2**63, "--vast-id"), ("num_gpus", 0, "--num-gpus"),
])
def test_register_checks_every_field_before_writing(conn, field, value, flag):
    """By the one check of register's values (lifecycle.register takes them checked; the command line's and an
    HTTP body's refusals are tested in test_cli_instance and test_server)."""
    with pytest.raises(BadInput) as caught:
        lifecycle.validate_register("u1", **{"label": "vastctl-a", field: value})
    assert said(caught.value).startswith(f"{flag} must be")
    assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] == 0
    assert events(conn) == []
