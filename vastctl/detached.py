"""A command judged by its exit alone (nginx's reload): what it prints goes to a file, not a pipe.

With pipes, the caller waits for their end, and a reload that leaves a background child holding stdout
(a daemon it started) reads as hung although it exited 0. Here the caller waits for the command's exit
only, at most `timeout` (and `limit`, the caller's own deadline, when sooner); a command past it is killed
with its whole process group. Its output, bounded, is kept for the error line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from typing import Any, Sequence

OUTPUT_BYTES = 16 * 1024


def run(argv: Sequence[str], *, timeout: float, limit: float | None = None, **_pipes: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run's answer for `argv` (its output in `stderr`), or TimeoutExpired once the time is up.
    Keyword arguments about pipes and text are accepted and not needed: the output is always text."""
    wait = timeout if limit is None else max(0.1, min(timeout, limit))
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        out.seek(0)
        said = out.read(OUTPUT_BYTES).decode("utf-8", "replace")
    return subprocess.CompletedProcess(list(argv), code, "", said)
