"""The one factory that builds the GPU market the config names, and wires the simulated one to the state file.

It sits above the providers and the state modules: the simulated market is handed
its state file and the report functions its machines call here, so the providers
themselves know no rows. Import-light on purpose: `requests` (or the simulator)
loads only when a provider is built, so `vastctl --help` stays fast.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from vastctl.errors import BadInput

if TYPE_CHECKING:
    import sqlite3

    from vastctl.clock import Clock
    from vastctl.config import Config
    from vastctl.providers.base import Provider


def get_provider(config: "Config", *, clock: "Clock", env: Mapping[str, str] | None = None,
                 **options: Any) -> "Provider":
    """The market the config names: `vast` (the real API) or `sim` (the embedded simulated market).

    `clock` is the caller's (the vast client's backoff sleeps on it; the simulated market runs to its
    time). `options` go to the provider's constructor (for `sim`: `conn=` to share a connection).
    Raises BadInput (exit 2) naming VAST_API_KEY when `vast` has no key; `sim` needs none.
    """
    env = os.environ if env is None else env
    if config.provider == "sim":
        return _sim_provider(config, clock=clock, **options)
    if config.provider != "vast":
        raise BadInput(f"provider {config.provider!r} is not available: set `provider: vast` or `provider: sim`")
    _refuse_a_simulated_market(config)
    from vastctl.providers.vast import VastProvider

    provider = VastProvider.from_env(env, clock=clock, **options)
    if provider is None:
        raise BadInput("no vast.ai API key: set VAST_API_KEY, or run `vastai set api-key KEY`"
                       " (writes ~/.config/vastai/vast_api_key)")
    return provider


def _refuse_a_simulated_market(config: "Config") -> None:
    """A state file whose machines live in a simulated market (a day `vastctl demo --keep` kept, the `provider: sim`
    playground's file) is wired to no vast.ai account: its vast ids are the simulator's, and sent to vast they
    would name someone's real machines. Its market is in the file (sim_meta), so its commands run under sim."""
    from vastctl.providers.sim_store import simulated_until

    if simulated_until(config.db_path) is not None:
        raise BadInput(f"{config.db_path} holds a simulated market (a day `vastctl demo --keep` kept, or the `provider:"
                       " sim` playground), not wired to vast.ai: its machines are the simulator's. To act on them, run"
                       " the command with a config that says `provider: sim` (--config or VASTCTL_CONFIG)")


def _sim_provider(config: "Config", *, clock: "Clock", conn: "sqlite3.Connection | None" = None,
                  **options: Any) -> "Provider":
    """The simulated market in the config's state file, its machines reporting straight into that file.

    Each report is stamped with the simulated moment it is made, so the file
    holds the market's time, whatever clock drives it.
    """
    from vastctl.machine.reports import LocalReports
    from vastctl.providers.sim import SimProvider
    from vastctl.state import db

    conn = conn if conn is not None else db.connect(config.db_path, now=clock.now())
    return SimProvider(conn, lambda at: LocalReports(conn, config, now=at), clock=clock,
                       seed=config.sim.seed, failures=config.sim.failures, **options)
