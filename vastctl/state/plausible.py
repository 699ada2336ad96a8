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

from typing import Mapping

from vastctl.state.rows import InstanceChanges, InstanceRow

MAX_RATE_PER_GPU = 200.0
MAX_GPUS_COUNTED = 8  # GPUs a machine's ceiling counts at most (an adopted machine's count is its own claim)
HEARTBEAT_RATE_FACTOR = 2.0  # a rate measured from heartbeats counts for at most this many times its bench rate


def rate_ceiling(row: Mapping[str, object]) -> float:
    """The most proofs/hour a machine of this many GPUs can plausibly prove (MAX_RATE_PER_GPU each); a count
    the manager does not know counts as one GPU. A stored count is at least 1 (checked where it entered: a
    report, or vast's offer or listing, vast_mapping.gpu_count). `row`: an InstanceRow, or any mapping with its
    num_gpus (the observation's rows)."""
    return _ceiling(row.get("num_gpus"))


def measured_rate_bound(row: Mapping[str, object]) -> float:
    """The most a rate measured from the machine's heartbeats counts for: its own bench rate times
    HEARTBEAT_RATE_FACTOR, and never above its ceiling."""
    return _bound(row.get("num_gpus"), row.get("bench_rate"))


def _ceiling(gpus: object) -> float:
    counted = gpus if isinstance(gpus, (int, float)) and gpus else 1
    return MAX_RATE_PER_GPU * min(counted, MAX_GPUS_COUNTED)


def _bound(gpus: object, bench: object) -> float:
    ceiling = _ceiling(gpus)
    if not isinstance(bench, (int, float)):  # None: nothing benchmarked
        return ceiling
    return min(ceiling, float(bench) * HEARTBEAT_RATE_FACTOR)


def within(row: InstanceRow, updates: InstanceChanges) -> InstanceChanges:
    """`updates` to `row`, plus the row's stored rates lowered to the bounds the row has after them: a lower
    GPU count lowers the ceiling its bench rate counts against, a lower bench rate its measured rate's bound."""
    result = updates.copy()
    gpus = updates.get("num_gpus", row["num_gpus"])
    bench = updates.get("bench_rate", row["bench_rate"])
    if bench is not None and bench > _ceiling(gpus):
        result["bench_rate"] = bench = _ceiling(gpus)
    measured = updates.get("proofs_per_hour", row["proofs_per_hour"])
    if measured is not None and measured > _bound(gpus, bench):
        result["proofs_per_hour"] = _bound(gpus, bench)
    return result
