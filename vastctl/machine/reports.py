"""The five reports a rented machine's boot script makes, and the push of its log tails, applied to the state file.

`LocalReports` writes the state file directly (the manager host, the
simulator, `vastctl serve`); a remote implementation speaks HTTP to `serve`.
Each method returns `{"state": …}` (bench_report adds `passed`) or raises the
typed error whose exit code the contract names (bench_failed always raises
BenchFailed: the machine is killed). A rate and a count arrive checked (rates.py says where).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import TYPE_CHECKING, Mapping, NoReturn

from vastctl.config import Config
from vastctl.machine.answers import Answer
from vastctl.state import lifecycle, rates, settings

if TYPE_CHECKING:
    from vastctl.facts.machine_logs import Pushed

# The report bodies' fields and the instance-command flags that carry them (the HTTP API ↔ the CLI): the CLI
# names a refused field by its flag (cli.said), and remote mode reads a manager's answer back into flags.
FIELD_FLAGS = {"label": "--label", "vast_id": "--vast-id", "gpu_name": "--gpu", "num_gpus": "--num-gpus",
               "rate": "--rate", "proofs_done": "--proofs-done", "failed": "--failed", "reason": "--reason",
               "name": "--name", "text": "--file", "uuid": "--uuid"}


class LocalReports:
    """Reports applied to the state file through lifecycle, stamped with `now` (the moment they are made)."""

    def __init__(self, conn: sqlite3.Connection, config: Config, *, now: datetime) -> None:
        self.conn = conn
        self.config = config
        self.now = now

    def register(self, uuid: str, *, label: str | None = None, vast_id: int | None = None, gpu_name: str | None = None,
                 num_gpus: int | None = None) -> Answer:
        prefix = self.config.vast.label_prefix
        row = lifecycle.register(self.conn, uuid, label=label, vast_id=vast_id, gpu_name=gpu_name,
                                 num_gpus=num_gpus, label_prefix=prefix, now=self.now)
        answer: Answer = {"state": row["state"]}
        note = lifecycle.prefix_note(row["label"], prefix)
        if note:
            answer["note"] = note
        return answer

    def params_done(self, uuid: str) -> Answer:
        return {"state": lifecycle.params_done(self.conn, uuid, now=self.now)["state"]}

    def bench_report(self, uuid: str, rate: float) -> Answer:
        gate = settings.get(self.conn, self.config, "min_bench_rate")
        row = rates.bench_report(self.conn, uuid, rate, gate=gate, now=self.now)
        return {"state": row["state"], "passed": True}

    def bench_failed(self, uuid: str, reason: str | None = None) -> NoReturn:
        lifecycle.bench_failed(self.conn, uuid, reason, now=self.now)  # always raises BenchFailed: the kill is done

    def running(self, uuid: str, stages: Mapping[str, float] | None = None) -> Answer:
        return {"state": lifecycle.running(self.conn, uuid, now=self.now, stages=stages)["state"]}

    def heartbeat(self, uuid: str, proofs_done: int | None = None) -> Answer:
        from vastctl.facts import deliveries

        state = rates.heartbeat(self.conn, uuid, proofs_done=proofs_done, now=self.now)["state"]
        if proofs_done is not None:  # a count is a claim: checked against what the proof router saw delivered
            deliveries.check_claim(self.conn, uuid, bench_proofs=self.config.launch.bench_count + 1, now=self.now)
        return {"state": state}

    def log_push(self, uuid: str, name: str, text: str) -> Pushed:
        from vastctl.facts import machine_logs

        return machine_logs.push(self.conn, uuid, name, text, now=self.now,
                                 secrets=machine_logs.handed(self.config, uuid))
