"""The five reports a machine's boot script makes, as the interface the simulated market reports through.

It lives here, at the providers' layer, because the simulator (providers/sim.py, sim_engine.py) is its
lowest user: the machines it simulates report through it. `machine.reports.LocalReports` (the state file) and
`machine.remote.RemoteReports` (HTTP to `vastctl serve`) implement it above.
"""

from __future__ import annotations

from typing import Mapping, Protocol

from vastctl.machine.answers import Answer, Stated

__all__ = ["Answer", "Reports", "Stated"]


class Reports(Protocol):
    def register(self, uuid: str, *, label: str | None, vast_id: int | None, gpu_name: str | None,
                 num_gpus: int | None) -> Answer: ...

    def params_done(self, uuid: str) -> Answer: ...

    def bench_report(self, uuid: str, rate: float) -> Answer: ...  # checked where it entered (state/rates.py)

    def bench_failed(self, uuid: str, reason: str | None) -> Answer: ...

    def running(self, uuid: str, stages: Mapping[str, float] | None = None) -> Answer: ...

    def heartbeat(self, uuid: str, proofs_done: int | None) -> Answer: ...

    def log_push(self, uuid: str, name: str, text: str) -> Stated: ...  # and what it kept (machine_logs.Pushed)
