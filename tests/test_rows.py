"""state/rows.py is the schema's present: each TypedDict has its table's columns, no more, no fewer, and a
column that may be NULL is `X | None` (one that may not, is not). A migration that adds a column fails here
until the row type has it too; so does a misspelled column name in rows.py."""

from __future__ import annotations

import sqlite3
import types
import typing

import pytest

from vastctl import clock
from vastctl.state import instances, lifecycle, rows
from vastctl.state.lifecycle import State

SQL_TYPES = {"TEXT": str, "INTEGER": int, "REAL": float}


def _columns(conn: sqlite3.Connection, table: str) -> dict[str, tuple[str, bool]]:
    """column → (declared type, may be NULL), as the migrated file has it."""
    return {row["name"]: (row["type"], not (row["notnull"] or row["pk"]))
            for row in conn.execute(f"PRAGMA table_info({table})")}


def _hinted(hint: object) -> tuple[set[type], bool]:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return {arg for arg in args if arg is not type(None)}, type(None) in args


@pytest.mark.parametrize("table", sorted(rows.TABLES))
def test_each_row_type_has_its_tables_columns(conn, table):
    columns = _columns(conn, table)
    assert columns, f"no table {table}"
    hints = typing.get_type_hints(rows.TABLES[table])
    assert sorted(hints) == sorted(columns), f"{table}: rows.py and the migrated schema disagree"
    for name, (declared, nullable) in columns.items():
        kinds, optional = _hinted(hints[name])
        assert kinds == {SQL_TYPES[declared]}, f"{table}.{name} is {declared}, typed {hints[name]}"
        assert optional == nullable, f"{table}.{name}: NULL allowed {nullable}, typed {hints[name]}"


def test_every_table_the_code_reads_has_a_row_type(conn):
    """Every table but the bookkeeping ones and the simulated market's own (providers/sim_store.py)."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    untyped = {name for name in tables - set(rows.TABLES)
               if not name.startswith(("sim_", "sqlite_")) and name != "migrations"}
    assert untyped == set()


def test_the_typed_row_is_the_plain_dict_it_always_was(conn):
    """At run time a typed row is the dict sqlite3 gave (what --json prints and the views extend)."""
    now = clock.parse_iso("2026-12-01T00:00:00Z")
    created = lifecycle.create(conn, uuid="u1", label="vastctl-u1", state=State.LAUNCHING, reason="t",
                               source="operator", now=now, fields={"dph": 0.5})
    found = instances.find(conn, "u1")
    assert type(created) is dict and type(found) is dict
    assert found == created and set(found) == set(typing.get_type_hints(rows.InstanceRow))
    assert found["dph"] == 0.5 and found["vast_id"] is None and found["proofs_done"] == 0
    assert instances.find(conn, "nobody") is None
    assert instances.undestroyed(conn) == [created]
