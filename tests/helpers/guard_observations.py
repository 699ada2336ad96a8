"""What guard.check is handed, built in memory at a fixed time: machines, demand, the fleet's limits, and a launch."""

from __future__ import annotations

from datetime import datetime, timezone

from vastctl.facts.demand import Demand
from vastctl.guard import Action, Kind
from vastctl.observe import Observation

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
LIMITS = {"target_proofs_per_hour": 100.0, "min_bench_rate": 40.0, "max_instances": 4, "max_hourly_spend": 3.0,
          "max_dph": 1.0}
QUEUED = Demand(queued=59, proofs_per_hour=80.0, at=NOW, age_s=10, source="command", known=True)
EMPTY = Demand(queued=0, proofs_per_hour=0.0, at=NOW, age_s=10, source="command", known=True)


def machine(label, state="running", dph=0.5, rate=60.0, vast_id=None, **extra):
    return {"uuid": f"u-{label}", "label": label, "state": state, "dph": dph, "expected_rate": rate,
            "vast_id": vast_id or abs(hash(label)) % 10000, "vast_status": "running", "vast_missing": 0,
            "gpu_name": "RTX 4090", "resumes": 0, **extra}


def obs(machines=(), demand=QUEUED, **limits):
    machines = list(machines)
    return Observation(now=NOW, settings={**LIMITS, **limits}, demand=demand, machines=machines,
                       capacity=sum(m["expected_rate"] for m in machines if m["state"] == "running"),
                       pending_capacity=0.0,
                       spend_per_hour=sum(m["dph"] for m in machines if m["state"] not in ("stopped", "killed")),
                       events=[], last_actions=[])


def launch(actor, **fields):
    return Action(kind=Kind.LAUNCH, actor=actor, **{"gpu_name": "RTX 4090", **fields})
