"""The fields of every TypedDict under the directories given, as a vulture whitelist on stdout (.ci/run).

A TypedDict's fields are read as row["key"], which vulture cannot see, and there are hundreds (every table's
columns, every --json object's keys): listed here from the code, they never need a line of the whitelist. A
class counts when a base is TypedDict or a class that does (by name, across the directories)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

classes: dict[str, list[ast.ClassDef]] = {}
for root in sys.argv[1:]:
    for path in sorted(Path(root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)


def base_names(node: ast.ClassDef) -> set[str]:
    return {base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
            if isinstance(base, (ast.Name, ast.Attribute))}


typed = {"TypedDict"}
while True:
    more = {name for name, nodes in classes.items() if any(base_names(n) & typed for n in nodes)} - typed
    if not more:
        break
    typed |= more
fields = sorted({stmt.target.id for name in typed - {"TypedDict"} for node in classes[name] for stmt in node.body
                 if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)})
for field in fields:
    print(f"_.{field}")
