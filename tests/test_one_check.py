"""validate.py is the only finite-number check: every other module asks it (validate.real, price, finite).

A scan of the package's source: a call of isfinite/isnan/isinf (from math, cmath or anything else), an equality
test against an infinity or a NaN (`x == math.inf`, `x != float("nan")`), or the NaN self-test `x != x`, in any
module but validate.py, fails here. Writing an infinity as a value (a ratio over nothing, an open bound, a metric
with no sample) computes, it does not check, and is not flagged.
"""

from __future__ import annotations

import ast

from helpers import package_source

THE_CHECK = package_source.PACKAGE / "validate.py"
TESTS = ("isfinite", "isnan", "isinf")
# Modules allowed a test of their own, each with why. None is needed today: keep it so.
ALLOWED: dict[str, str] = {}


def _special(node: ast.expr) -> bool:
    """`math.inf`, `math.nan`, `float("inf")`, `float("-nan")`…: an infinity or a NaN written out."""
    if isinstance(node, ast.Attribute) and node.attr in ("inf", "nan", "infj", "nanj"):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _special(node.operand)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and node.args[0].value.strip().lstrip("+-").lower() in ("inf", "infinity", "nan"))


def finite_checks(source: str | ast.Module) -> list[tuple[int, str]]:
    """(line, what) for each finite-number check written out in `source` (its text, or its parsed tree)."""
    found = []
    for node in ast.walk(ast.parse(source) if isinstance(source, str) else source):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in TESTS:
                found.append((node.lineno, f"{name}()"))
        elif isinstance(node, ast.ImportFrom) and any(alias.name in TESTS for alias in node.names):
            found.append((node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
                    continue
                if _special(left) or _special(right):
                    found.append((node.lineno, "a comparison with an infinity or a NaN"))
                elif ast.dump(left) == ast.dump(right) and isinstance(op, ast.NotEq):
                    found.append((node.lineno, "x != x (the NaN self-test)"))
    return found


def test_validate_is_the_only_finite_number_check():
    offences = []
    for module in package_source.modules():
        if module.path == THE_CHECK or module.name in ALLOWED:
            continue
        offences += [f"vastctl/{module.name}:{line}: {what}" for line, what in finite_checks(module.tree)]
    assert offences == [], "ask validate.py (validate.real, validate.price, validate.finite) instead:\n" + "\n".join(
        offences)


def test_validate_itself_checks_finiteness():
    assert finite_checks(THE_CHECK.read_text())  # the scan finds what it looks for where it is allowed


def test_the_scan_finds_each_way_of_writing_a_check():
    samples = {
        "import math\nmath.isfinite(x)": 1, "from math import isnan\nisnan(x)": 2, "cmath.isinf(z)": 1,
        "x == math.inf": 1, "x != float('-inf')": 1, "y is float('nan')": 1, "x != x": 1,
        "wait = math.inf": 0, "low <= n <= float('inf')": 0, "best = a / b if b else float('inf')": 0, "x == y": 0,
    }
    assert {source: len(finite_checks(source)) for source in samples} == samples
