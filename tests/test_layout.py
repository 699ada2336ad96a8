"""No module under tests/ or bench/ imports a test module or conftest: what several test modules share lives in
tests/helpers/, and a shared fixture is registered there (conftest's pytest_plugins) and taken by name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "bench")


def imported_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) for each import of a `test_*` module or of conftest, at any depth: `import`, `from … import`,
    and importlib.import_module or __import__ given the name as a literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")):
            names = [node.args[0].value]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top.startswith("test_") or top == "conftest":
                found.append((node.lineno, name))
    return found


def test_no_module_imports_a_test_module_or_conftest():
    offending = [f"{path.relative_to(ROOT)}:{line} imports {module}"
                 for directory in SCANNED for path in sorted((ROOT / directory).rglob("*.py"))
                 for line, module in imported_test_modules(path.read_text())]
    assert offending == [], "move what is shared into tests/helpers/ (docs/development.md):\n" + "\n".join(offending)


def test_the_check_finds_each_way_of_importing_one():
    source = ("import test_cli\nfrom test_rules import CONFIG\nimport conftest as c\nfrom conftest import cli\n"
              "def f():\n    from test_db import file_at\n    importlib.import_module('test_sim')\n"
              "import helpers.boot\nfrom helpers.dashboard import Browser\nimport testing_tools\nfrom serving import query\n")
    assert imported_test_modules(source) == [(1, "test_cli"), (2, "test_rules"), (3, "conftest"), (4, "conftest"),
                                             (6, "test_db"), (7, "test_sim")]


def test_every_python_module_beside_the_tests_is_a_test_or_conftest():
    """What is not a test lives in tests/helpers/ (or is a program the tests run: tests/fakes/, go_curio_client/)."""
    loose = sorted(path.name for path in (ROOT / "tests").glob("*.py")
                   if not path.name.startswith("test_") and path.name != "conftest.py")
    assert loose == [], f"move {', '.join(loose)} into tests/helpers/ (docs/development.md)"
