"""What a host's RAM allows it to prove: a rate read off measured points (docs/workload.md "Host RAM bounds
the rate").

The agent ranks offers with its own points (agent/valuation.py's RAM_RATES, what it believes) and the simulated
market proves at its own (sim_market.py's RAM_CAP, what a simulated host really does); both read them here, the
same way.
"""

from __future__ import annotations

from typing import Sequence

RamPoints = Sequence[tuple[float, float]]  # (GiB of host RAM, proofs/hour it allows), by RAM ascending


def rate_allowed(points: RamPoints, ram_gb: float) -> float:
    """Proofs/hour a host with `ram_gb` GiB allows: in proportion below the first point (no RAM, no proofs),
    linear between two points, the last point's rate above it."""
    if ram_gb <= points[0][0]:
        return points[0][1] * ram_gb / points[0][0]
    for (low, low_rate), (high, high_rate) in zip(points, points[1:]):
        if ram_gb <= high:
            return low_rate + (high_rate - low_rate) * (ram_gb - low) / (high - low)
    return points[-1][1]
