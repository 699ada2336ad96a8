"""SQL against `instances` lives in state/ (and in facts/, which it serves): a module elsewhere asks
state/instances.py (one function per question) instead of writing its own. A scan of every string literal
(implicit concatenations and f-strings' text included) for SQL that names the table."""

from __future__ import annotations

import ast
import re

from helpers import package_source

HOMES = ("state/", "facts/")  # where SQL against instances belongs
# SQL's keywords are upper case in this code base: prose ("a row from instances") is not SQL
SQL = re.compile(r"\b(FROM|INTO|UPDATE|JOIN|TABLE)\s+instances\b")


def _texts(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal; an f-string's text with each {…} as `?`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "?"
                           for part in node.values)
            found.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def sql_naming_instances(source: str | ast.Module) -> list[int]:
    """The lines of the string literals in `source` (its text, or its parsed tree) that hold SQL naming the
    instances table."""
    tree = ast.parse(source) if isinstance(source, str) else source
    return sorted({line for line, text in _texts(tree) if SQL.search(text)})


def _offenders() -> dict[str, list[int]]:
    found = {}
    for module in package_source.modules():
        if module.name.startswith(HOMES):
            continue
        lines = sql_naming_instances(module.tree)
        if lines:
            found[module.name] = lines
    return found


def test_sql_against_instances_only_in_state_and_facts():
    offenders = _offenders()
    assert offenders == {}, ("SQL against `instances` outside vastctl/state/ and vastctl/facts/ (module: lines);"
                             " add a function to vastctl/state/instances.py and call it")


def test_the_scan_sees_sql_however_the_literal_is_written():
    assert sql_naming_instances('q = "SELECT * FROM instances WHERE uuid = ?"\n') == [1]
    assert sql_naming_instances('q = ("SELECT uuid FROM"\n     " instances")\n') == [1]
    assert sql_naming_instances('q = f"UPDATE instances SET {a} = ?"\n') == [1]
    assert sql_naming_instances('q = f"SELECT * FROM instances{where}"\n') == [1]
    assert sql_naming_instances('x = 1\nq = "INSERT INTO instances (uuid) VALUES (?)"\n') == [2]
    assert sql_naming_instances('q = "SELECT * FROM sim_instances"\n') == []
    assert sql_naming_instances('"""Pages of /api/v1/instances/, and a row from instances."""\n') == []
