"""No decision reads a message's words: a scan of vastctl/ for a string test (`"x" in msg`, `.startswith`,
`.endswith`, `re.search`/`match`) on a value named as text made for people (a reason, a message, an error, a
status message). Decisions read fields: an event's code and data, an answer's `field`, vast's error code.

Two places read words by design, each documented where it is:
  reconcile/decide.py start_failure   vast's status_msg against its explicit list (docs/interface.md)
  state/db.py explain                 SQLite's own error text, for Python 3.10's sqlite3 (no sqlite_errorname)
"""

from __future__ import annotations

import ast

from helpers import package_source

TEXT_NAMES = ("reason", "message", "msg", "status_msg", "kill_reason", "error", "detail", "text")
ALLOWED = {("reconcile/decide.py", "start_failure"), ("state/db.py", "explain")}
STRING_TESTS = {"startswith", "endswith"}
REGEX_TESTS = {"search", "match", "fullmatch"}


def _names_text(node: ast.AST) -> bool:
    """A name, attribute or subscript whose last part names text made for people (`row["kill_reason"]`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("lower", "casefold",
                                                                                                  "strip"):
        return _names_text(node.func.value)
    if isinstance(node, ast.Name):
        last = node.id
    elif isinstance(node, ast.Attribute):
        last = node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        last = node.slice.value
    else:
        return False
    return any(last == name or last.endswith("_" + name) for name in TEXT_NAMES)


def _text_tests(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) and any(
                        _names_text(right) for right in node.comparators):
                    found.append((node.lineno, function.name))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in STRING_TESTS and _names_text(node.func.value):
                    found.append((node.lineno, function.name))
                elif (node.func.attr in REGEX_TESTS and isinstance(node.func.value, ast.Name)
                      and node.func.value.id == "re" and len(node.args) > 1 and _names_text(node.args[1])):
                    found.append((node.lineno, function.name))
    return found


def test_no_decision_reads_a_messages_words():
    found = []
    for module in package_source.modules():
        for line, function in _text_tests(module.tree):
            if (module.name, function) not in ALLOWED:
                found.append(f"{module.name}:{line} ({function})")
    assert found == [], "a decision reads a message's words; carry a field instead:\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for():
    """The scan itself: each shape it refuses is found, and a test on a field is not."""
    source = '''
def forced(row): return row["kill_reason"].endswith("(forced)")
def key(text): return "user key" in text.lower()
def failed(status_msg): return re.search(r"error", status_msg)
def fine(row): return row["kill_code"] == "operator" and "x" in row["labels"]
'''
    assert [name for _, name in _text_tests(ast.parse(source))] == ["forced", "key", "failed"]
