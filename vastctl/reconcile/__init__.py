"""reconcile: the deterministic safety net between the state file and what vast says.

One pass (run.run_pass): take the `reconcile` lease, list every vast instance, decide with the pure
decide.plan(), record what was seen (listing: the listing cache as state), then apply the actions
(effects: kills through lifecycle, each one event with source `reconcile` and a kill code; destroys through
operations, retried every pass until vast confirms). A dry run is the same pass with every change left out.

A failed listing, or one in which more than `max_vanish_fraction` of the
live fleet vanished at once, aborts the pass before anything is killed: a
broken API looks exactly like a mass death.

Before planning, every running machine's tunnel is probed (tunnel.check: joined or not, since when);
after applying, the tunnel account's authorized_keys is rewritten from the rows (a killed machine's key
pruned) and nginx's upstream list refreshed (provers.refresh); a failure of either is one of the
pass's errors, and the next pass tries again. A pass ends by reconcile.deadline: the vast calls it could
not make are skipped and recorded, and it exits 1.

The modules, each one concern: decide (pure: rows + listing → actions), effects (the actions done, through
the guard), listing (vast_listings, vast_cache and each row's view of vast), run (the pass).
"""

from vastctl.reconcile.decide import ListingDistrusted, Matched, match, plan
from vastctl.reconcile.effects import Budget, PassResult, apply
from vastctl.reconcile.listing import record_failed_listing, record_listing
from vastctl.reconcile.run import LEASE, LEASE_TTL_S, lease_ttl, listing_notes, run_pass

__all__ = [
    "LEASE", "LEASE_TTL_S", "Budget", "ListingDistrusted", "Matched", "PassResult", "apply",
    "lease_ttl", "listing_notes", "match", "plan", "record_failed_listing", "record_listing", "run_pass",
]
