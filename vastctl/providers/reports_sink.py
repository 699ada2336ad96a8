"""The five reports a machine's boot script makes, as the interface the simulated market reports through.

It lives here, at the providers' layer, because the simulator (providers/sim.py, sim_engine.py) is its
lowest user: the machines it simulates report through it. `machine.reports.LocalReports` (the state file) and
`machine.remote.RemoteReports` (HTTP to `vastctl serve`) implement it above.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Reports"]


class Reports(Protocol):
    def register(self, uuid: str, *, label: str | None, vast_id: int | None, gpu_name: str | None,
                 num_gpus: int | None) -> dict[str, Any]: ...

    def params_done(self, uuid: str) -> dict[str, Any]: ...

    def bench_report(self, uuid: str, rate: float) -> dict[str, Any]: ...  # checked where it entered (state/rates.py)

    def bench_failed(self, uuid: str, reason: str | None) -> dict[str, Any]: ...

    def running(self, uuid: str, stages: dict[str, Any] | None = None) -> dict[str, Any]: ...

    def heartbeat(self, uuid: str, proofs_done: int | None) -> dict[str, Any]: ...

    def log_push(self, uuid: str, name: str, text: str) -> dict[str, Any]: ...
