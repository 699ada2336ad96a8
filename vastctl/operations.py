"""Provider calls that spend or stop spending money, each audited and reflected in the state file."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from . import clock
from .audit import record_action
from .db import transaction
from .providers.base import Provider, ProviderError


def destroy(conn: sqlite3.Connection, provider: Provider, row: dict[str, Any], *, actor: str,
            now: datetime | None = None) -> bool:
    """Destroy the row's machine at the market; True once the market confirms it is gone.

    `destroyed_at` is set only on confirmation. A failure is recorded on the row
    (`destroy_attempts`, `destroy_error`) and in the audit, and False is returned:
    the caller (every reconcile pass) tries again. Never raises ProviderError.
    """
    now = now or clock.utcnow()
    if row.get("destroyed_at"):
        return True
    if row.get("vast_id") is None:  # nothing was ever created at the market under this row
        _mark(conn, row["uuid"], {"destroyed_at": clock.to_iso(now), "destroy_error": None})
        return True
    try:
        provider.destroy_instance(row["vast_id"])
    except ProviderError as exc:
        record_action(conn, actor=actor, kind="destroy", ok=False, result=str(exc), uuid=row["uuid"],
                      label=row["label"], vast_id=row["vast_id"], now=now)
        with transaction(conn):
            conn.execute(
                "UPDATE instances SET destroy_attempts = destroy_attempts + 1, destroy_error = ? WHERE uuid = ?",
                (str(exc), row["uuid"]),
            )
        return False
    record_action(conn, actor=actor, kind="destroy", ok=True, result="destroyed", uuid=row["uuid"],
                  label=row["label"], vast_id=row["vast_id"], now=now)
    _mark(conn, row["uuid"], {"destroyed_at": clock.to_iso(now), "destroy_error": None})
    return True


def _mark(conn: sqlite3.Connection, uuid: str, columns: dict[str, Any]) -> None:
    assignments = ", ".join(f"{name} = ?" for name in columns)
    with transaction(conn):
        conn.execute(f"UPDATE instances SET {assignments} WHERE uuid = ?", (*columns.values(), uuid))
