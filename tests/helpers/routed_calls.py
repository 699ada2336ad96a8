"""The calls the proof router kept on a machine, as proof_calls rows ending at given times before a fixed now."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from vastctl import clock

NOW = datetime(2031, 3, 3, 12, 0, tzinfo=timezone.utc)
SLOTS = 5


def attempts(uuid, *, prover_s, ends, results=None, now=NOW):
    """One proof_calls row per end time (seconds before now), each prover_s long on the prover."""
    results = results or ["completed"] * len(ends)
    return [{"at": clock.to_iso(now - timedelta(seconds=end)), "request_id": f"r{i}", "kind": "porep",
             "uuid": uuid, "label": uuid[2:], "result": result, "held_ms": 0, "prover_ms": round(prover_s * 1000),
             "attempt": 1, "size_bytes": 10} for i, (end, result) in enumerate(zip(ends, results))]


def kept_full(uuid, *, prover_s=300.0, batches=12, results=None, now=NOW):
    """The router kept `SLOTS` calls on the machine for an hour: batches of five, each batch prover_s long."""
    ends = [b * prover_s for b in range(batches) for _ in range(SLOTS)]
    return attempts(uuid, prover_s=prover_s, ends=ends, results=results, now=now)


def one_at_a_time(uuid, *, prover_s=300.0, calls=12):
    """A call at a time, back to back: the machine's other slots stayed free."""
    return attempts(uuid, prover_s=prover_s, ends=[n * prover_s for n in range(calls)])
