"""What a refused command must show and leave: one `error:` line, and every row as it was."""

from __future__ import annotations

import sqlite3


def one_error_line(result, code, *fragments):
    assert result.code == code, result
    assert result.err.startswith("error: ") and result.err.count("\n") == 1, result.err
    assert "unexpected" not in result.err
    for fragment in fragments:
        assert fragment in result.err, result.err


def contents(db_path):
    """Every row of every table: what a refused call must leave as it was."""
    return list(sqlite3.connect(db_path).iterdump())
