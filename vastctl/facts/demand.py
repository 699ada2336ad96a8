"""Demand: how much proving work is waiting, from an operator's report or the `demand.command`.

Every sample is kept with its time (`demand_samples`), failed ones too, so an
operator can see when the source went quiet. The newest sample decides:

  known      it succeeded and is at most `demand.stale_after` old
  unknown    no sample yet, the newest is older than `demand.stale_after`, or the
             command failed, timed out or printed something other than
             {"queued": N, "proofs_per_hour": X} (numbers past any real queue included)

A sample may also say `in_flight` (tasks a Curio node has claimed: with cuzk they
wait or prove at a daemon, so they are work for the fleet too) and `lookahead`
(sectors whose PoRep task Curio will create within the hour or so: work a machine
booting now would meet). Both are optional; a report with only `queued` is whole.
It may also say when that work comes: `arrivals`, the PoRep tasks coming in each
ARRIVAL_BUCKET_S from now (the first bucket starting now), and `later`, the sectors
in earlier stages whose PoRep comes beyond what the buckets know, a count with no time.

Unknown demand is never read as "no work": the guard and the rules policy hold
the fleet on it (the incident this exists for: a missing "active" flag read as
an empty queue stopped every machine while 59 proofs sat queued).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Mapping, Sequence, TypedDict

from vastctl import clock, upstream, validate
from vastctl.config import Config
from vastctl.errors import BadInput
from vastctl.state.db import inserted_id, transaction
from vastctl.state.rows import DemandSampleRow, typed
from vastctl.validate import Invalid

COMMAND_TIMEOUT_S = 20.0  # leaves most of a one-minute cron tick to the step that asked
MAX_OUTPUT_CHARS = 64 * 1024
EXPECTED = ('print one JSON object like {"queued": 12, "proofs_per_hour": 40}'
            ' (optional: "in_flight": N, "lookahead": N, "arrivals": [N, …], "later": N)')
# Past any real Curio cluster's queue or rate, well inside SQLite's integers: beyond it a number is a fault
MAX_COUNT = 1_000_000_000
MAX_DIGITS = 19  # a JSON integer longer than this is refused before Python converts it
ARRIVAL_BUCKET_S = 600  # each count of `arrivals` is the PoRep tasks coming in 10 minutes, the first from now
ARRIVAL_BUCKETS = 9  # what jobs/curio-demand.sh reports (and the simulated day): the next 90 minutes
MAX_ARRIVAL_BUCKETS = 18  # 3 hours of them, room past what precommitted sectors tell (~75 minutes)


class DemandView(TypedDict):
    """The `demand show --json` object (docs/interface.md), in this order."""

    queued: int | None
    in_flight: int | None
    lookahead: int | None
    proofs_per_hour: float | None
    arrivals: list[int] | None
    later: int | None
    at: str | None
    age_s: int | None
    source: str | None
    known: bool
    error: str | None
    empty_since: str | None
    held: int


@dataclass(frozen=True)
class Demand:
    """The demand one decision reads. `known` False means: do not act as if the queue were empty."""

    queued: int | None
    proofs_per_hour: float | None
    at: datetime | None
    age_s: float | None
    source: str | None
    known: bool
    error: str | None = None
    empty_since: datetime | None = None  # start of the current run of good samples that all said no work
    in_flight: int | None = None  # claimed tasks (at a daemon); None: the source does not say
    lookahead: int | None = None  # PoRep tasks about to be created; None: the source does not say
    # when they come: the PoRep tasks of each ARRIVAL_BUCKET_S from now, the first bucket starting now
    arrivals: tuple[int, ...] | None = None
    later: int | None = None  # sectors in earlier stages, their PoRep beyond the buckets: a count with no time
    # calls the proof router holds for a free prover (facts/deliveries.py): measured by the manager, so work
    # even while the source is unknown; Curio counts them in flight, so they are not added to in_flight
    held: int = 0

    @property
    def work(self) -> int:
        """Known work for the fleet: queued, in flight (at least what the router holds) and about to be queued
        (0 where the source is silent)."""
        return (self.queued or 0) + max(self.in_flight or 0, self.held) + (self.lookahead or 0)

    def view(self) -> DemandView:
        """The `demand show --json` object."""
        return {"queued": self.queued, "in_flight": self.in_flight, "lookahead": self.lookahead,
                "proofs_per_hour": self.proofs_per_hour,
                "arrivals": None if self.arrivals is None else list(self.arrivals), "later": self.later,
                "at": clock.display_iso(clock.to_iso(self.at)), "age_s": None if self.age_s is None else round(self.age_s),
                "source": self.source, "known": self.known, "error": self.error,
                "empty_since": clock.display_iso(clock.to_iso(self.empty_since)), "held": self.held}


def validate_count(name: str, value: object, what: str = "proofs waiting") -> int:
    """A whole number of tasks, 0 … MAX_COUNT."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Invalid(name, f"must be a whole number ≥ 0 ({what}), got {_show(value)}")
    if value > MAX_COUNT:
        raise Invalid(name, f"must be at most {MAX_COUNT:,} (past any real queue), got {_show(value)}")
    return value


def validate_queued(value: object) -> int:
    return validate_count("queued", value)


def validate_optional_count(name: str, value: object) -> int | None:
    """in_flight / lookahead: absent (None) or a count."""
    what = {"in_flight": "tasks claimed", "lookahead": "PoRep tasks about to be created",
            "later": "sectors in earlier stages"}.get(name, "tasks")
    return None if value is None else validate_count(name, value, what)


def validate_arrivals(value: object) -> tuple[int, ...] | None:
    """arrivals: absent (None) or a list of at most MAX_ARRIVAL_BUCKETS counts, one for each ARRIVAL_BUCKET_S."""
    if value is None:
        return None
    shape = (f"a list of at most {MAX_ARRIVAL_BUCKETS} whole numbers from 0 to {MAX_COUNT:,} (PoRep tasks coming in each"
             " 10 minutes)")
    if not isinstance(value, (list, tuple)):
        raise Invalid("arrivals", f"must be {shape}, got {_show(value)}")
    if len(value) > MAX_ARRIVAL_BUCKETS:
        raise Invalid("arrivals", f"must be {shape}, got {len(value)} numbers")
    for count in value:
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            raise Invalid("arrivals", f"must be {shape}, got {_show(count)} in it")
    return tuple(value)


def arrivals_from_text(text: str) -> tuple[int, ...]:
    """`--arrivals 3,0,5`: the counts, comma-separated; Invalid as validate_arrivals words it."""
    counts: list[object] = []
    for part in text.split(","):
        digits = part.strip()
        counts.append(int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= MAX_DIGITS else digits)
    checked = validate_arrivals(counts)
    assert checked is not None  # a list is never None
    return checked


def validate_rate(value: object) -> float | None:
    if value is None:
        return None
    try:
        rate = validate.finite(value, "proofs_per_hour")
    except Invalid:  # the same rule, the value shown as the rest of this module shows one
        raise Invalid("proofs_per_hour", f"must be a finite number ≥ 0, got {_show(value)}") from None
    if rate > MAX_COUNT:
        raise Invalid("proofs_per_hour", f"must be at most {MAX_COUNT:,} (past any real rate), got {_show(value)}")
    return rate


def _show(value: object) -> str:
    """A value quoted into an error, short even for a 400-digit number."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a number of {len(str(abs(value)))} digits"
    return upstream.clip(repr(value), 40)


class SampleFields(TypedDict):
    """record()'s keyword arguments for a good sample."""

    queued: int
    proofs_per_hour: float | None
    in_flight: int | None
    lookahead: int | None
    arrivals: tuple[int, ...] | None
    later: int | None


@dataclass(frozen=True)
class Sample:
    """What one report or one run of the command said (validated)."""

    queued: int
    proofs_per_hour: float | None = None
    in_flight: int | None = None
    lookahead: int | None = None
    arrivals: tuple[int, ...] | None = None
    later: int | None = None


def record(conn: sqlite3.Connection, *, source: str, now: datetime, queued: int | None = None,
           proofs_per_hour: float | None = None, error: str | None = None, in_flight: int | None = None,
           lookahead: int | None = None, arrivals: tuple[int, ...] | None = None, later: int | None = None) -> int:
    """Keep one sample; a sample with an error is a failed one (queued unknown). `arrivals` is kept as a JSON list."""
    with transaction(conn):
        cursor = conn.execute(
            "INSERT INTO demand_samples (at, queued, in_flight, lookahead, arrivals, later, proofs_per_hour, source,"
            " ok, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (clock.to_iso(now), queued, in_flight, lookahead, None if arrivals is None else json.dumps(list(arrivals)),
             later, proofs_per_hour, source, int(error is None), error),
        )
        return inserted_id(cursor)


def report(conn: sqlite3.Connection, queued: int, proofs_per_hour: float | None, *, now: datetime,
           in_flight: int | None = None, lookahead: int | None = None, arrivals: Sequence[int] | None = None,
           later: int | None = None) -> int:
    """An operator's (or a script's) report: `vastctl demand report --queued N`. Validated before anything is kept."""
    sample = Sample(queued=validate_queued(queued), proofs_per_hour=validate_rate(proofs_per_hour),
                    in_flight=validate_optional_count("in_flight", in_flight),
                    lookahead=validate_optional_count("lookahead", lookahead), arrivals=validate_arrivals(arrivals),
                    later=validate_optional_count("later", later))
    return record(conn, source="report", now=now, **_fields(sample))


def _fields(sample: Sample) -> SampleFields:
    """A sample's fields as record() takes them (asdict would copy `arrivals` into a list)."""
    return {"queued": sample.queued, "proofs_per_hour": sample.proofs_per_hour, "in_flight": sample.in_flight,
            "lookahead": sample.lookahead, "arrivals": sample.arrivals, "later": sample.later}


def parse_output(text: str) -> Sample:
    """The command's stdout → a Sample; BadInput on anything else (a number past range included)."""
    try:
        data = json.loads(text, parse_int=_json_int)
    except RecursionError:
        raise BadInput(f"demand.command printed JSON nested too deeply to be a demand report: {EXPECTED}") from None
    except ValueError:
        raise BadInput(f"demand.command printed no JSON ({_clip(text)!r}): {EXPECTED}") from None
    except BadInput as exc:
        raise BadInput(f"demand.command printed {exc}: {EXPECTED}") from None
    if not isinstance(data, dict) or "queued" not in data:
        raise BadInput(f"demand.command printed {_clip(text)!r}: {EXPECTED}")
    return Sample(queued=validate_queued(data["queued"]), proofs_per_hour=validate_rate(data.get("proofs_per_hour")),
                  in_flight=validate_optional_count("in_flight", data.get("in_flight")),
                  lookahead=validate_optional_count("lookahead", data.get("lookahead")),
                  arrivals=validate_arrivals(data.get("arrivals")), later=validate_optional_count("later", data.get("later")))


def _json_int(digits: str) -> int:
    """JSON integers, refused past MAX_DIGITS before Python converts them (a 5,000-digit one would be slow)."""
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise BadInput(f"a number of {len(digits.lstrip('-'))} digits (out of range)")
    return int(digits)


Runner = Callable[[str, float, Mapping[str, str]], tuple[int, str, str]]


def run_command(command: str, timeout_s: float, extra_env: Mapping[str, str]) -> tuple[int, str, str]:
    """Run through the shell in its own process group, so a timeout kills the whole pipeline (psql included);
    `extra_env` on top of ours (VASTCTL_SECTOR_SIZE: the sectors the fleet proves, which the Curio script counts).

    Output is read as bytes: stderr (a localized psql error may be latin-1) is shown with U+FFFD for what is
    not UTF-8; stdout that is not UTF-8 is refused (BadInput), since no number in it can be trusted."""
    process = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True, env={**os.environ, **extra_env})
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    shown_err = err.decode("utf-8", "replace")
    try:
        shown_out = out.decode("utf-8")
    except UnicodeDecodeError as exc:
        if process.returncode != 0:  # its exit is the news; the bytes are only shown
            return process.returncode, out.decode("utf-8", "replace"), shown_err
        raise BadInput(f"demand.command printed output that is not UTF-8 (byte 0x{out[exc.start]:02x} at offset"
                       f" {exc.start}): {EXPECTED}") from None
    return process.returncode, shown_out, shown_err


def sample_command(conn: sqlite3.Connection, config: Config, *, now: datetime, runner: Runner = run_command) -> Demand:
    """Run `demand.command` once and keep what it said (or why it said nothing usable)."""
    command = config.demand.command.strip()
    if not command:
        raise BadInput("demand.command is not set in the config: set it, or use `vastctl demand report`")
    error = None
    sample = None
    try:
        code, out, err = runner(command, COMMAND_TIMEOUT_S, {"VASTCTL_SECTOR_SIZE": config.launch.sector_size})
        if code != 0:
            error = f"demand.command exited {code}: {_clip(err or out, 240)}"
        else:
            sample = parse_output(out[:MAX_OUTPUT_CHARS])
    except subprocess.TimeoutExpired:
        error = f"demand.command timed out after {COMMAND_TIMEOUT_S:g}s"
    except OSError as exc:
        error = f"demand.command could not run: {exc}"
    except BadInput as exc:
        error = str(exc)
    if sample is None:
        record(conn, source="command", now=now, error=error)
    else:
        record(conn, source="command", now=now, **_fields(sample))
    return current(conn, config, now=now)


def refresh(conn: sqlite3.Connection, config: Config, *, now: datetime, runner: Runner = run_command) -> Demand:
    """Sample the command when one is configured, then the current demand."""
    if config.demand.command.strip():
        return sample_command(conn, config, now=now, runner=runner)
    return current(conn, config, now=now)


def current(conn: sqlite3.Connection, config: Config, *, now: datetime) -> Demand:
    """The demand as the newest sample tells it (no command is run)."""
    found = conn.execute("SELECT * FROM demand_samples ORDER BY id DESC LIMIT 1").fetchone()
    if found is None:
        return Demand(queued=None, proofs_per_hour=None, at=None, age_s=None, source=None, known=False,
                      error="no demand sample yet: set demand.command, or run `vastctl demand report --queued N`")
    row = typed(found, DemandSampleRow)
    at = clock.parse_iso(row["at"])
    age = max(0.0, (now - at).total_seconds())
    if not row["ok"]:
        return Demand(queued=None, proofs_per_hour=None, at=at, age_s=age, source=row["source"], known=False,
                      error=row["error"])
    stale = age > config.demand.stale_after
    error = (f"the newest sample is {clock.human_duration(age)} old (demand.stale_after"
             f" {clock.human_duration(config.demand.stale_after)})") if stale else None
    return Demand(queued=row["queued"], proofs_per_hour=row["proofs_per_hour"], at=at, age_s=age,
                  source=row["source"], known=not stale, error=error, empty_since=_empty_since(conn),
                  in_flight=row["in_flight"], lookahead=row["lookahead"], arrivals=_arrivals(row["arrivals"]),
                  later=row["later"])


def _arrivals(stored: str | None) -> tuple[int, ...] | None:
    """The stored JSON list, as it was validated when kept (None: the sample did not say)."""
    if stored is None:
        return None
    counts = json.loads(stored)
    return tuple(int(count) for count in counts) if isinstance(counts, list) else None


def _empty_since(conn: sqlite3.Connection) -> datetime | None:
    """When the work last ran out: the first of the newest unbroken run of good samples saying 0 queued,
    0 in flight and 0 about to come (a sample silent on the last two counts them as 0)."""
    broken = conn.execute(
        "SELECT coalesce(max(id), 0) FROM demand_samples WHERE NOT (ok = 1 AND queued = 0"
        " AND coalesce(in_flight, 0) = 0 AND coalesce(lookahead, 0) = 0)").fetchone()[0]
    # NOT INDEXED: read the ids after `broken`, not the index on `at` (which min(at) would walk from the oldest sample)
    first = conn.execute("SELECT min(at) FROM demand_samples NOT INDEXED WHERE id > ?", (broken,)).fetchone()[0]
    return clock.from_iso(first)


def _clip(text: str, limit: int = 160) -> str:
    """The command's output quoted into an error: one line, masked, escaped, bounded (upstream.clip)."""
    return upstream.clip(text, limit) or "(nothing)"
