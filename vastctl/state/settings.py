"""Runtime settings: values an operator (or the agent) changes while the fleet runs.

The config file's `fleet:` section gives the initial values; a `settings set`
stores an override in the file and records an event, so the agent sees every
change at its next step.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Literal, TypedDict

from vastctl import clock, validate
from vastctl.config import Config, range_of
from vastctl.errors import BadInput
from vastctl.state.db import transaction
from vastctl.state.lifecycle import record_event
from vastctl.validate import Invalid

KEYS: dict[str, type] = {
    "target_proofs_per_hour": float,
    "min_bench_rate": float,
    "max_instances": int,
    "max_hourly_spend": float,
    "max_daily_spend": float,
    "max_dph": float,
}


class SettingListed(TypedDict):
    """One setting as `settings list` and the dashboard show it: its value now and where that comes from."""

    key: str
    value: float | int
    source: Literal["settings", "config"]  # a stored override, else the config file's initial value
    updated_at: str | None  # the override's time (None for the config's)


def _check_key(key: str) -> None:
    if key not in KEYS:
        raise BadInput(f"unknown setting {key!r}: one of {', '.join(KEYS)}")


def parse_value(key: str, text: str | float) -> float | int:
    """A setting's value, in the range the config file allows for `fleet.KEY` (config.RANGES: one rule for both).

    A refusal names the setting by its key, as every place that sets one does (the CLI's KEY, the dashboard's
    form): a plain BadInput, not an Invalid a caller would rename."""
    _check_key(key)
    kind = "int" if KEYS[key] is int else "float"
    allowed = range_of(f"fleet.{key}", kind)
    value = validate.real(text, text=True)
    try:
        if value is None or (kind == "int" and not value.is_integer()):
            raise allowed.refusal(key, kind, text, value)
        allowed.check(value, key, kind, text)
    except Invalid as exc:
        raise BadInput(str(exc)) from None
    return int(value) if kind == "int" else value


def effective(conn: sqlite3.Connection, config: Config) -> dict[str, float | int]:
    """Every runtime setting: the stored override, else the config's initial value."""
    values: dict[str, float | int] = {key: getattr(config.fleet, key) for key in KEYS}
    for row in conn.execute("SELECT key, value FROM settings"):
        if row["key"] in KEYS:
            values[row["key"]] = KEYS[row["key"]](float(row["value"]))
    return values


def listing(conn: sqlite3.Connection, config: Config) -> list[SettingListed]:
    stored = {row["key"]: row["updated_at"] for row in conn.execute("SELECT key, updated_at FROM settings")}
    return [
        {"key": key, "value": value, "source": "settings" if key in stored else "config",
         "updated_at": clock.display_iso(stored.get(key))}
        for key, value in effective(conn, config).items()
    ]


def get(conn: sqlite3.Connection, config: Config, key: str) -> float | int:
    _check_key(key)
    return effective(conn, config)[key]


def set_value(
    conn: sqlite3.Connection,
    config: Config,
    key: str,
    text: str | float,
    *,
    source: str = "operator",
    now: datetime,
) -> bool:
    """Store a new value and record the change as an event; False when the value is unchanged."""
    value = parse_value(key, text)
    with transaction(conn):
        old = effective(conn, config)[key]
        if old == value:
            return False
        conn.execute(
            "INSERT INTO settings (key, value, updated_at) VALUES (?, ?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (key, repr(value), clock.to_iso(now)),
        )
        record_event(conn, kind="setting", source=source, now=now, reason=f"{key} {old:g} → {value:g}",
                     data={"key": key, "old": old, "new": value})
    return True
