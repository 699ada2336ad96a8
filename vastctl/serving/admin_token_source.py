"""Where `server.admin_token` came from, so that every message about it names the place the operator finds it.

config.load's order: VASTCTL_ADMIN_TOKEN beats the config file's `server.admin_token`, and the file beside the
state file (what `vastctl demo --keep` leaves, config.admin_token_file) is read only when neither set one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from html import escape
from typing import Literal, Mapping

from vastctl.config import Config, admin_token_file

Kind = Literal["environment", "file_beside", "config"]


@dataclass(frozen=True)
class TokenSource:
    kind: Kind
    name: str  # VASTCTL_ADMIN_TOKEN, the file's name (day.db.admin-token), or server.admin_token

    @property
    def html(self) -> str:
        """Where to find it, as the sign-in page says it (the names are the operator's own: escaped anyway)."""
        if self.kind == "environment":
            return f"<code>{escape(self.name)}</code> in the manager's environment"
        if self.kind == "file_beside":
            return f"the token in <code>{escape(self.name)}</code>, beside the state file"
        return f"the manager's <code>{escape(self.name)}</code>"

    @property
    def text(self) -> str:
        if self.kind == "environment":
            return f"{self.name} in the manager's environment"
        if self.kind == "file_beside":
            return f"the token in {self.name}, beside the state file"
        return f"{self.name} from the manager's config"


def admin_token_source(config: Config, env: Mapping[str, str] | None = None) -> TokenSource:
    """The place config.load took `config.server.admin_token` from (an empty token: the config's key)."""
    env = os.environ if env is None else env
    token = config.server.admin_token
    if token and env.get("VASTCTL_ADMIN_TOKEN", "").strip() == token:
        return TokenSource("environment", "VASTCTL_ADMIN_TOKEN")
    beside = admin_token_file(config.db_path)
    try:
        if token and beside.read_text(encoding="utf-8").strip() == token:
            return TokenSource("file_beside", beside.name)
    except (OSError, UnicodeDecodeError):  # none there (the usual case), or not ours to read
        pass
    return TokenSource("config", "server.admin_token")
