"""JSON as a type: what json.loads returns and json.dumps takes, for a value whose shape no TypedDict says (a stored
JSON column shown as it was written, a setting event's old and new values)."""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
