"""Where a Prove goes by its kind: the operator's own daemon, the rented fleet, or refused.

Curio verifies some of the proofs cuzk returns before using them and not others (docs/joining-curio.md, "Which
proofs go where"). A rented machine is someone else's computer, and a GPU can fail silently:
where Curio does not verify, the only protection is where the call is sent.

  kind          Curio verifies it?                      goes to
  PoRep         yes (VerifySeal)                        the fleet
  WindowPoSt    yes (VerifyWindowPoSt)                  route.own_daemon when set, else the fleet ahead of held calls
  SnapDeals     no: on chain in ProveReplicaUpdates3    the fleet if route.unverified_to_fleet lists snap, else
                                                        route.own_daemon, else refused (FAILED_PRECONDITION)
  WinningPoSt   no: put in the block as it came         the same, with winning_post
  any other     (the daemon answers it)                 the fleet
"""

from __future__ import annotations

from enum import Enum

from vastctl.config import RouteSection
from vastctl.route import wire

UNVERIFIED = {wire.SNAP_DEALS_UPDATE: "SnapDeals", wire.WINNING_POST: "WinningPoSt"}  # Curio uses these unverified
KIND_WORDS = {wire.POREP_SEAL_COMMIT: "PoRep", wire.SNAP_DEALS_UPDATE: "SnapDeals",
              wire.WINDOW_POST_PARTITION: "WindowPoSt", wire.WINNING_POST: "WinningPoSt"}


class Way(Enum):
    """Where a Prove of one kind goes."""

    OWN_DAEMON = "own_daemon"  # route.own_daemon: sent at once, whole, unheld and unretried
    FLEET = "fleet"  # held for a rented prover's free slot (a PoSt kind ahead of the other held calls)
    REFUSED = "refused"  # FAILED_PRECONDITION naming the settings: no prover is tried


def routing(route: RouteSection) -> dict[int, Way]:
    """The table above for these settings, by proof kind (a kind not in it goes to the fleet)."""
    own = bool(route.own_daemon)
    ways = {wire.POREP_SEAL_COMMIT: Way.FLEET, wire.WINDOW_POST_PARTITION: Way.OWN_DAEMON if own else Way.FLEET}
    for kind in UNVERIFIED:
        ways[kind] = (Way.FLEET if wire.KIND_NAMES[kind] in route.unverified_to_fleet
                      else Way.OWN_DAEMON if own else Way.REFUSED)
    return ways


def named(ways: dict[int, Way]) -> dict[str, str]:
    """The table by kind name (wire.KIND_NAMES) and way, as route_status keeps it for the dashboard."""
    return {wire.KIND_NAMES[kind]: way.value for kind, way in sorted(ways.items())}


def risky(route: RouteSection) -> bool:
    """Whether the settings refuse a kind, send an unverified one to the fleet, or use the deprecated key: what
    the router's start-up line is a warning for."""
    ways = routing(route)
    return bool(route.post_address) or any(
        ways[kind] is not Way.OWN_DAEMON for kind in UNVERIFIED)


def words(route: RouteSection) -> str:
    """Where each kind goes, in one line: what `vastctl route` says and logs as it starts."""
    ways = routing(route)
    parts = []
    for way in (Way.REFUSED, Way.OWN_DAEMON, Way.FLEET):  # the refusals first: what an operator must see
        kinds = [kind for kind in KIND_WORDS if ways[kind] is way]
        if not kinds:
            continue
        listed = _and([KIND_WORDS[kind] for kind in kinds])
        if way is Way.OWN_DAEMON:
            parts.append(f"{listed} to your own daemon {route.own_daemon} (route.own_daemon)")
        elif way is Way.REFUSED:
            parts.append(f"{listed} refused (FAILED_PRECONDITION): Curio does not verify them, route.own_daemon is"
                         " not set and route.unverified_to_fleet does not list them")
        else:
            unverified = [KIND_WORDS[kind] for kind in kinds if kind in UNVERIFIED]
            parts.append(f"{listed} to the rented fleet"
                         + (f" ({_and(unverified)} UNVERIFIED, route.unverified_to_fleet: a bad proof goes on chain)"
                            if unverified else ""))
    if route.post_address:
        parts.append("route.post_address is deprecated: it is route.own_daemon now, which takes SnapDeals too")
    return "; ".join(parts)


def refusal(kind: int) -> str:
    """The status message of a call refused for its kind (Way.REFUSED): one line naming both settings."""
    name = wire.KIND_NAMES[kind]
    return (f"vastctl route does not send {KIND_WORDS[kind]} proofs to rented machines (Curio uses them without"
            f" verifying them) and has no own daemon for them: set route.own_daemon to your own cuzk daemon, or"
            f" list {name} in route.unverified_to_fleet to send them to the fleet unverified; no prover was tried")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
