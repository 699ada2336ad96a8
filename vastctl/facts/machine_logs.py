"""What a machine said: the tail of each of its boot logs, as its boot script pushed it.

A machine's log is hostile text. It is kept as text only, bounded, and made
safe once, when it arrives: secrets masked (below), every
control, bidi and separator character but the newline shown as an escape
(`\\x1b`, `\\u202e`), and cut to its last MAX_CHARS characters at a line
start. Nothing here renders or runs it: `vastctl logs` prints it escaped and
the dashboard puts it in a <pre> HTML-escaped. One row per machine and log
name, replaced at each push, so the table stays the size of the fleet.

Boot logs hold secrets (an `env` dump, `set -x`, a failing command's line), so
before anything is stored every value the manager handed that machine (its
token, each launch.env value) is masked wherever it appears,
as is every value of a `NAME=value` / `"name": value` whose name holds KEY,
TOKEN, SECRET or PASSWORD (CONTAINER_API_KEY, VAST_API_KEY, the tunnel key)
and each other appearance of that value, private key blocks (PEM or OpenSSH,
also a block whose head the tail cut off), base64 of one, any base64-looking run
of 200 characters or more, and bearer tokens. The tunnel's private key is not
kept by the manager, so it is found by its shape.
"""

from __future__ import annotations

import re
import sqlite3
from datetime import datetime
from typing import Iterable, Literal, TypedDict

from vastctl import clock, upstream
from vastctl.config import Config
from vastctl.errors import BadInput
from vastctl.state import lifecycle, tokens
from vastctl.state.db import transaction
from vastctl.validate import Invalid

LogName = Literal["onstart", "fetch", "cuzk", "bench"]
NAMES: tuple[LogName, ...] = ("onstart", "fetch", "cuzk", "bench")  # the boot script's logs: its own, the parameter fetch, cuzk, the bench
MAX_CHARS = 16 * 1024  # the tail kept per machine and log
PUSH_BYTES = 32 * 1024  # what `log-push` reads from the end of the file (the HTTP body limit is 64 KiB)
RECENT_MACHINES = 12  # machines whose logs the dashboard shows, the latest pushed first


MASK = upstream.MASK
MIN_SECRET_CHARS = upstream.MIN_SECRET_CHARS
NAMED_VALUE_CHARS = 8  # a named value masked wherever else it appears too; shorter ones ("running") would garble
_NAMED = re.compile(  # NAME=value, NAME: value, "name": "value" (a name is short: no regex blow-up on long runs)
    r"(?<![\w.-])([\w.-]{1,100}[\"']?\s*[:=]\s*[\"']?)([^\s\"',;&)}\]]+)")
_SECRET_NAME = re.compile(r"(?i)key|token|secret|passw(?:or)?d")
_KEY_BLOCK = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
_HEADLESS_BLOCK = re.compile(r"\A(?:[ \t]*[A-Za-z0-9+/=]+[ \t]*\n)+-----END [A-Z0-9 ]*PRIVATE KEY-----")
_BASE64_KEY = re.compile(r"LS0tLS1CRUdJT[A-Za-z0-9+/=]*")  # base64 of "-----BEGIN…"
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{200,}={0,2}")


def handed(config: Config, uuid: str) -> list[str]:
    """The secret values the manager handed the machine at launch: its token (under every secret in the file) and
    every launch.env value (the launch's audit masks them all too)."""
    values = list(config.launch.env.values())
    try:
        values += [tokens.machine_token(secret, uuid) for secret in tokens.read_secrets(config.secret_path)]
    except (BadInput, OSError):  # no secret file: no token was handed out under it
        pass
    return [str(value) for value in values]


def masked(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret the module docstring lists replaced by ***."""
    text = _HEADLESS_BLOCK.sub(MASK, _KEY_BLOCK.sub(MASK, text))
    named = {found.group(2) for found in _NAMED.finditer(text) if _SECRET_NAME.search(found.group(1))}
    text = _NAMED.sub(lambda found: found.group(1) + MASK if _SECRET_NAME.search(found.group(1)) else found.group(0),
                      text)
    known = {value for value in secrets if len(value) >= MIN_SECRET_CHARS}
    known |= {value for value in named if len(value) >= NAMED_VALUE_CHARS and value != MASK}
    for value in sorted(known, key=len, reverse=True):
        text = text.replace(value, MASK)
    text = _BASE64_RUN.sub(_looks_random, _BASE64_KEY.sub(MASK, text))
    return upstream.mask(text)


def _looks_random(found: re.Match[str]) -> str:
    """A long run is base64 of something (a key) when it mixes capitals, small letters and digits; `xxxx…` is not."""
    run = found.group(0)
    mixed = any(ch.isupper() for ch in run) and any(ch.islower() for ch in run) and any(ch.isdigit() for ch in run)
    return MASK if mixed else run


class Pushed(TypedDict):
    """What a push kept (`log-push --json`, the HTTP answer)."""

    state: str
    name: str
    chars: int
    cut: bool


class Log(TypedDict):
    """One of a machine's logs as `logs --json` shows it."""

    name: str
    at: str | None
    cut: bool
    text: str


class Logs(TypedDict):
    """The `logs --json` object: one machine and its logs, in NAMES order."""

    label: str
    uuid: str
    state: str
    logs: list[Log]


class RecentLog(TypedDict):
    """One log of a machine that pushed lately, as the dashboard lists it: its machine's label, then the log."""

    label: str
    name: str
    at: str | None
    cut: bool
    text: str


def check_name(name: object) -> LogName:
    if not isinstance(name, str) or name not in NAMES:
        raise Invalid("name", f"must be one of {', '.join(NAMES)}, got {upstream.clip(repr(name), 60)}")
    return name


def made_safe(text: object, secrets: Iterable[str] = ()) -> tuple[str, bool]:
    """The text as it is kept: masked, escaped line by line, cut to its tail. Returns (text, whether it was cut)."""
    if not isinstance(text, str):
        raise BadInput(f'the log "text" must be text, got {type(text).__name__}')
    lines = masked(text.replace("\r\n", "\n"), secrets).split("\n")
    safe = "\n".join(upstream.escape_controls(line) for line in lines)
    if len(safe) <= MAX_CHARS:
        return safe, False
    tail = safe[-MAX_CHARS:]
    newline = tail.find("\n")
    return (tail[newline + 1:] if 0 <= newline < len(tail) - 1 else tail), True


def tail_of_file(data: bytes) -> str:
    """The last PUSH_BYTES of a log file as text (bytes that are not UTF-8 become U+FFFD)."""
    return data[-PUSH_BYTES:].decode("utf-8", "replace")


def push(conn: sqlite3.Connection, uuid: str, name: str, text: object, *, now: datetime,
         secrets: Iterable[str] = ()) -> Pushed:
    """Keep the tail a machine pushed (a killed machine may still push: its logs say why it failed), `secrets`
    (what the manager handed it: `handed()`) masked with the rest. `name` is one check_name() passed where it
    entered (the command line, the HTTP body)."""
    safe, was_cut = made_safe(text, secrets)
    with transaction(conn):
        row = lifecycle.get(conn, uuid)
        conn.execute(
            "INSERT INTO machine_logs (uuid, name, at, text, cut) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (uuid, name) DO UPDATE SET at = excluded.at, text = excluded.text, cut = excluded.cut",
            (uuid, name, clock.to_iso(now), safe, int(was_cut)))
    return {"state": row["state"], "name": name, "chars": len(safe), "cut": was_cut}


def _view(row: sqlite3.Row) -> Log:
    return {"name": row["name"], "at": clock.display_iso(row["at"]), "cut": bool(row["cut"]), "text": row["text"]}


def tails(conn: sqlite3.Connection, label_or_uuid: str, name: str | None = None) -> Logs:
    """One machine's logs, in NAMES order (the `logs --json` shape)."""
    if name is not None:
        check_name(name)
    row = lifecycle.resolve(conn, label_or_uuid)
    logs = [_view(r) for r in conn.execute("SELECT * FROM machine_logs WHERE uuid = ?", (row["uuid"],))
            if name is None or r["name"] == name]
    logs.sort(key=lambda log: NAMES.index(log["name"]) if log["name"] in NAMES else len(NAMES))
    return {"label": row["label"], "uuid": row["uuid"], "state": row["state"], "logs": logs}


def recent(conn: sqlite3.Connection, machines: int = RECENT_MACHINES) -> list[RecentLog]:
    """The logs of the machines that pushed last (the dashboard's view), newest machine first."""
    latest = [r["uuid"] for r in conn.execute(
        "SELECT uuid, max(at) AS last FROM machine_logs GROUP BY uuid ORDER BY last DESC, uuid LIMIT ?", (machines,))]
    out: list[RecentLog] = []
    for uuid in latest:
        row = conn.execute("SELECT label FROM instances WHERE uuid = ?", (uuid,)).fetchone()
        if row is None:
            continue
        out.extend({"label": row["label"], **log} for log in tails(conn, uuid)["logs"])
    return out
