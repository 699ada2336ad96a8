"""state/fleet_rows.py: the views' and the listing's reads of `instances`."""

from __future__ import annotations

from vastctl.config import from_mapping
from vastctl.providers.base import RemoteInstance
from vastctl.reconcile import listing
from vastctl.state import fleet_rows


def add(conn, n, *, vast_id, destroyed_at=None, state="killed", kill_code="exited"):
    conn.execute("INSERT INTO instances (uuid, label, state, vast_id, created_at, state_since, destroyed_at, kill_code)"
                 " VALUES (?, ?, ?, ?, '2026-12-01T00:00:00Z', '2026-12-01T00:00:00Z', ?, ?)",
                 (f"u{n}", f"vastctl-{n:05d}", state, vast_id, destroyed_at, kill_code))


def test_the_strays_context_of_a_long_listing_is_the_newest_destroyed_row_per_instance_and_its_first_sighting(conn):
    for n in range(1200):  # more ids than one read takes
        add(conn, n, vast_id=n, destroyed_at=f"2026-12-01T01:{n % 60:02d}:00Z")
    add(conn, 5000, vast_id=7, destroyed_at="2026-12-01T03:00:00Z", kill_code="operator")  # the host's later row
    add(conn, 5001, vast_id=8, destroyed_at=None, state="running")  # not destroyed: not history
    conn.execute("INSERT INTO vast_cache (vast_id, label, first_seen_at, seen_at) VALUES (2000, 'vastctl-orphan',"
                 " '2026-12-01T02:00:00Z', '2026-12-01T02:00:00Z')")
    conn.commit()
    unclaimed = [RemoteInstance(id=i, label=f"vastctl-{i:05d}") for i in range(0, 1300, 2)]
    unclaimed.append(RemoteInstance(id=2000, label="vastctl-orphan"))
    first_seen, history = listing.strays_context(conn, from_mapping({}), unclaimed)
    assert first_seen == {2000: "2026-12-01T02:00:00Z"}
    assert set(history) == set(range(0, 1200, 2))
    assert history[8] == {"uuid": "u8", "label": "vastctl-00008", "vast_id": 8, "kill_code": "exited",
                          "destroyed_at": "2026-12-01T01:08:00Z"}
    assert fleet_rows.newest_destroyed(conn, [7])[7]["uuid"] == "u5000"


def test_kills_and_pending_destroys_count_killed_rows(conn):
    add(conn, 1, vast_id=1, destroyed_at=None, kill_code="exited")
    add(conn, 2, vast_id=2, destroyed_at="2026-12-01T01:00:00Z", kill_code=None)
    add(conn, 3, vast_id=3, destroyed_at=None, state="running", kill_code=None)
    conn.execute("UPDATE instances SET killed_at = '2026-12-01T00:30:00Z' WHERE uuid = 'u1'")
    conn.commit()
    assert fleet_rows.kills_by_code(conn) == {"exited": 1, "unknown": 1}
    assert fleet_rows.pending_destroys(conn) == (1, "2026-12-01T00:30:00Z")
    assert [row["uuid"] for row in fleet_rows.listed(conn, include_killed=False)] == ["u1", "u3"]
