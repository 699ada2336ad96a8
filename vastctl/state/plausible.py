"""The most a machine's claimed rates may count for, and a row's rates kept within it.

What a machine says it proves is a claim. cuzk's fastest published figures are ~100 proofs/h per GPU (RTX 5090,
H100; the best host measured is CPU-bound at ~24 s/proof, 150/h; docs/workload.md): a bench rate counts for at
most twice that per GPU (rate_ceiling), a rate measured from heartbeats for at most HEARTBEAT_RATE_FACTOR times
the machine's bench rate (measured_rate_bound).

A rate is bounded once, when it is written: rates.py bounds each report, and a write that moves a bound (a new
bench rate, an adopted machine re-saying its GPU count) bounds the stored rates again with it (within). So a
stored `bench_rate` is within rate_ceiling() of its row and a stored `proofs_per_hour` within
measured_rate_bound(): readers (observe.py, the views) count them as they are. Rows written before the bounds
were bounded once by a migration (state/migrations.py: "a machine's stored rates within their bounds…").
"""

from __future__ import annotations

from typing import Any, Mapping

MAX_RATE_PER_GPU = 200.0
MAX_GPUS_COUNTED = 8  # GPUs a machine's ceiling counts at most (an adopted machine's count is its own claim)
HEARTBEAT_RATE_FACTOR = 2.0  # a rate measured from heartbeats counts for at most this many times its bench rate


def rate_ceiling(row: Mapping[str, Any]) -> float:
    """The most proofs/hour a machine of this many GPUs can plausibly prove (MAX_RATE_PER_GPU each); a count
    the manager does not know counts as one GPU. A stored count is at least 1 (checked where it entered: a
    report, or vast's offer or listing, vast_mapping.gpu_count)."""
    gpus: int = row.get("num_gpus") or 1
    return MAX_RATE_PER_GPU * min(gpus, MAX_GPUS_COUNTED)


def measured_rate_bound(row: Mapping[str, Any]) -> float:
    """The most a rate measured from the machine's heartbeats counts for: its own bench rate times
    HEARTBEAT_RATE_FACTOR, and never above its ceiling."""
    ceiling = rate_ceiling(row)
    bench = row.get("bench_rate")
    if bench is None:
        return ceiling
    return min(ceiling, float(bench) * HEARTBEAT_RATE_FACTOR)


def within(row: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """`updates` to `row`, plus the row's stored rates lowered to the bounds the row has after them: a lower
    GPU count lowers the ceiling its bench rate counts against, a lower bench rate its measured rate's bound."""
    after = {**row, **updates}
    result = dict(updates)
    bench = after.get("bench_rate")
    if bench is not None and bench > rate_ceiling(after):
        result["bench_rate"] = after["bench_rate"] = rate_ceiling(after)
    measured = after.get("proofs_per_hour")
    if measured is not None and measured > measured_rate_bound(after):
        result["proofs_per_hour"] = measured_rate_bound(after)
    return result
