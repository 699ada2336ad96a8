"""An interruptible machine vast paused for a higher bid: waited for, rebid, or released. Pure.

Waiting costs only its storage; a rebid is capped by max_dph and its offer's on-demand price; past the cap a
fresh machine (BOOT_HOURS of boot) costs less than the capacity an unbounded wait loses. The plan
(agent/rules.py) turns the choice into an action.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from vastctl import clock
from vastctl.agent.valuation import BOOT_HOURS
from vastctl.config import Config
from vastctl.state.lifecycle import State

REBID_STEP = 0.25  # an outbid machine's bid rises by this share a round, up to its cap


def outbid_since(machine: Mapping[str, Any]) -> datetime | None:
    """When vast paused this interruptible machine for a higher bid (reconcile's listing), None if it is not."""
    if machine.get("bid") is None or machine.get("state") != State.RUNNING or machine.get("vast_status") != "stopped":
        return None  # on demand, or running again (restarting after a pause counts as capacity on its way)
    return clock.from_iso(machine.get("outbid_since")) or clock.from_iso(machine.get("vast_seen_at")) or None


def outbid_choice(machine: Mapping[str, Any], now: datetime, max_dph: float,
                  config: Config) -> tuple[str, float | None, str]:
    """What an outbid machine gets: ("wait" | "rebid" | "release", the new bid or None, why).

    Waiting costs only its storage (capacity does not count it, so the fleet grows around it), and it resumes
    with its disk and parameters. After agent.outbid_wait its bid rises by REBID_STEP, capped by max_dph and the
    on-demand price of its offer (ask_dph: a bid over that pays more than renting on demand); each rebid is
    given agent.outbid_wait again. One already bidding its cap that is still outbid is released: a fresh
    machine costs BOOT_HOURS of boot, an unbounded wait costs the capacity it was rented for."""
    since = outbid_since(machine)
    paused = max(0.0, (now - since).total_seconds()) if since is not None else 0.0
    bid = float(machine.get("bid") or 0.0)
    cap = float(max_dph)
    ask = machine.get("ask_dph")  # an offer's price, checked where it entered (validate.price)
    if ask is not None:
        cap = min(cap, float(ask))
    waited = f"outbid for {paused / 60:.0f}m at ${bid:g}/h"
    if paused < config.agent.outbid_wait:
        return "wait", None, f"{waited}: waited for (agent.outbid_wait {config.agent.outbid_wait / 60:g}m; disk kept)"
    if bid < cap - 1e-9:
        new = round(min(cap, max(bid * (1 + REBID_STEP), bid + 0.001)), 4)
        return "rebid", new, f"{waited}: bid raised to ${new:g}/h (cap ${cap:g}/h: max_dph and its on-demand price)"
    return "release", None, (f"{waited}, already bidding its cap ${cap:g}/h: released (a fresh machine costs"
                             f" {BOOT_HOURS:g}h of boot; waiting on costs the capacity)")
