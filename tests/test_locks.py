"""locks: leases take their time from the holder (its injected clock), so they work on virtual time too."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta, timezone

import pytest

from vastctl import clock
from vastctl.clock import VirtualClock
from vastctl.errors import Unavailable
from vastctl.state import locks

START = datetime(2026, 11, 30, 5, 0, tzinfo=timezone.utc)


def expires_at(conn, name):
    row = conn.execute("SELECT expires_at FROM locks WHERE name = ?", (name,)).fetchone()
    return None if row is None else row["expires_at"]


def test_a_lease_starts_and_renews_at_the_holders_time(conn):
    virtual = VirtualClock(START)
    with locks.held(conn, "reconcile", ttl_s=600, now=virtual.now()) as lease:
        assert expires_at(conn, "reconcile") == clock.to_iso(START + timedelta(seconds=600))
        virtual.advance(90)
        lease.renew(virtual.now())
        assert expires_at(conn, "reconcile") == clock.to_iso(START + timedelta(seconds=690))
        virtual.advance(3600)
        lease.renew(virtual.now())
        assert expires_at(conn, "reconcile") == clock.to_iso(START + timedelta(seconds=4290))
    assert expires_at(conn, "reconcile") is None


def test_a_lease_held_on_virtual_time_expires_on_virtual_time(conn):
    virtual = VirtualClock(START)
    assert locks.acquire(conn, "reconcile", ttl_s=60, holder="elsewhere:1", now=virtual.now()) == "elsewhere:1"
    with pytest.raises(Unavailable, match="another reconcile is running"):
        with locks.held(conn, "reconcile", ttl_s=60, now=virtual.now()):
            pass
    virtual.advance(61)
    with locks.held(conn, "reconcile", ttl_s=60, now=virtual.now()) as lease:
        assert lease.holder == f"{socket.gethostname()}:{os.getpid()}"
