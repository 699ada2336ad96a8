"""reconcile.plan's inputs as plain snapshots at a fixed time: an instance row, what vast listed for it, and the
kills a plan holds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from vastctl import clock
from vastctl.providers.base import RemoteInstance

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
SETTINGS = {"min_bench_rate": 40.0, "target_proofs_per_hour": 0.0}


def ago(**delta) -> str:
    return clock.to_iso(NOW - timedelta(**delta))


def row(label: str, state: str = "running", vast_id: int | None | str = "auto", **fields) -> dict:
    number = int(label.rsplit("-", 1)[-1]) if label[-1].isdigit() else 0
    base = {
        "uuid": f"u-{label}", "label": label, "state": state, "vast_id": 100 + number if vast_id == "auto" else vast_id,
        "machine_id": 9000 + number, "bench_rate": 68.0, "state_since": ago(hours=1),
        "last_heartbeat_at": ago(minutes=1), "vast_status": "running", "vast_status_msg": None,
        "vast_seen_at": ago(minutes=1), "vast_missing": 0, "resumed_at": None, "destroyed_at": None,
        "killed_at": None, "kill_code": None, "kill_reason": None, "destroy_attempts": 0, "destroy_error": None,
        "proofs_done": 10,
    }
    base.update(fields)
    return base


def seen(r: dict, status: str | None = "running", **fields) -> RemoteInstance:
    return RemoteInstance(id=r["vast_id"], label=r["label"], actual_status=status,
                          intended_status=fields.pop("intended_status", "running"), machine_id=r["machine_id"],
                          **fields)


def kills(actions):
    return {(a.label, a.code) for a in actions if a.kind == "kill"}
