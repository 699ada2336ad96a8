"""What makes a list of migrations one the state file can follow: each numbered by its place (1, 2, … with no gap
or duplicate) and named once (migrations.py holds the list; db.py applies it).

A migration's number is written beside it, not taken from its place in the list, so two branches that both add
one collide on the number (check() refuses the list at import) instead of renumbering each other's silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Migration:
    """One change to the schema: its number (1, 2, … with no gap), its name (what the file records), its SQL."""

    number: int
    name: str
    sql: str


class MisnumberedMigrations(ValueError):
    """A list of migrations with a gap, a duplicate or a number out of order, or two of one name."""


def check(shipped: Sequence[Migration]) -> tuple[Migration, ...]:
    """`shipped` as it is, once each migration is known to carry the number of its place (1, 2, …) and a name no
    other has: a gap, a duplicate number or name, or a migration out of order is refused, naming it."""
    names: dict[str, int] = {}
    for expected, migration in enumerate(shipped, start=1):
        if migration.number != expected:
            raise MisnumberedMigrations(
                f"migration {migration.number} ({migration.name!r}) stands where migration {expected} belongs:"
                " migrations are numbered 1, 2, … in order, without a gap or a duplicate; give a new one the next"
                " number")
        if migration.name in names:
            raise MisnumberedMigrations(
                f"migrations {names[migration.name]} and {migration.number} share the name {migration.name!r}:"
                " each migration's name is its own (the file records it)")
        names[migration.name] = migration.number
    return tuple(shipped)
