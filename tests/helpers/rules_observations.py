"""Observations for the rules policy, built in memory at a fixed time: machines, demand, settings and a market of
offers, with the agent config the expectations are sized for."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from vastctl import config as config_module
from vastctl.facts.demand import Demand
from vastctl.observe import Observation
from vastctl.providers.base import Offer

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SETTINGS = {"target_proofs_per_hour": 100.0, "min_bench_rate": 40.0, "max_instances": 10,
            "max_hourly_spend": 10.0, "max_dph": 1.0}
CONFIG = config_module.from_mapping({"agent": {"headroom": 0.15, "scale_down_after": "1h", "plan_horizon": "30m",
                                               "max_actions_per_step": 5}})  # sized to 115 proofs/h


def queued(n, empty_for_min=None, in_flight=None, lookahead=None):
    since = None if empty_for_min is None else NOW - timedelta(minutes=empty_for_min)
    return Demand(queued=n, proofs_per_hour=50.0, at=NOW, age_s=30, source="command", known=True, empty_since=since,
                  in_flight=in_flight, lookahead=lookahead)


UNKNOWN = Demand(queued=None, proofs_per_hour=None, at=NOW - timedelta(hours=2), age_s=7200, source="command",
                 known=False, error="demand.command timed out after 20s",
                 empty_since=NOW - timedelta(hours=3))  # the last good samples said empty: still hold


def m(label, state="running", rate=60.0, dph=0.5, status="running", resumes=0, missing=0):
    return {"uuid": f"u-{label}", "label": label, "state": state, "expected_rate": rate, "dph": dph,
            "vast_id": 100 + len(label), "vast_status": status, "vast_missing": missing, "gpu_name": "RTX 4090",
            "resumes": resumes}


def offer(offer_id, gpu="RTX 4090", dph=0.5, machine_id=None):
    return Offer(id=offer_id, machine_id=machine_id or offer_id * 10, gpu_name=gpu, num_gpus=1, dph_total=dph)


def observation(machines, demand, **settings):
    return Observation(now=NOW, settings={**SETTINGS, **settings}, demand=demand, machines=list(machines),
                       capacity=sum(x["expected_rate"] for x in machines if x["state"] == "running"),
                       pending_capacity=sum(x["expected_rate"] for x in machines
                                            if x["state"] in ("launching", "registered", "params_done", "bench_done")),
                       spend_per_hour=sum(x["dph"] for x in machines if x["state"] not in ("stopped", "killed")),
                       events=[], last_actions=[], model_rates={"RTX 4090": 60.0, "RTX 5090": 100.0})


MARKET = [offer(1, dph=0.45), offer(2, dph=0.40), offer(3, "RTX 5090", dph=0.95), offer(4, dph=0.50)]
