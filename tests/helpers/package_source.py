"""vastctl's own source, read and parsed once a test process: the scans that hold the package to a rule
(no decision on a message's words, one finite-number check, SQL against instances in state/) walk the same trees."""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

import vastctl

PACKAGE = Path(vastctl.__file__).parent


class Module(NamedTuple):
    name: str  # its path under vastctl/, e.g. "state/db.py"
    path: Path
    tree: ast.Module


@functools.cache
def modules() -> tuple[Module, ...]:
    """Every module of the package, by path."""
    return tuple(Module(path.relative_to(PACKAGE).as_posix(), path, ast.parse(path.read_text(), str(path)))
                 for path in sorted(PACKAGE.rglob("*.py")))
