"""locks: leases take their time from the injected clock, so they work on virtual time too."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta, timezone

import pytest

from vastctl import clock, locks
from vastctl.clock import VirtualClock
from vastctl.errors import Unavailable

START = datetime(2026, 11, 30, 5, 0, tzinfo=timezone.utc)


def expires_at(conn, name):
    row = conn.execute("SELECT expires_at FROM locks WHERE name = ?", (name,)).fetchone()
    return None if row is None else row["expires_at"]


def test_a_lease_on_virtual_time_starts_and_renews_at_the_clocks_time(conn):
    virtual = VirtualClock(START)
    with locks.held(conn, "reconcile", ttl_s=600, clock=virtual) as lease:
        assert expires_at(conn, "reconcile") == clock.to_iso(START + timedelta(seconds=600))
        virtual.advance(90)
        lease.renew()
        assert expires_at(conn, "reconcile") == clock.to_iso(START + timedelta(seconds=690))
        virtual.advance(3600)
        lease.renew()
        assert expires_at(conn, "reconcile") == clock.to_iso(START + timedelta(seconds=4290))
    assert expires_at(conn, "reconcile") is None


def test_renew_measures_elapsed_time_from_an_injected_start(conn):
    """`now` may be given apart from the clock (a caller's fixed moment): renew adds the clock's elapsed time."""
    virtual = VirtualClock(START + timedelta(days=3))
    with locks.held(conn, "launch", ttl_s=60, now=START, clock=virtual) as lease:
        virtual.advance(30)
        lease.renew()
        assert expires_at(conn, "launch") == clock.to_iso(START + timedelta(seconds=90))


def test_a_lease_held_on_virtual_time_expires_on_virtual_time(conn):
    virtual = VirtualClock(START)
    assert locks.acquire(conn, "reconcile", ttl_s=60, holder="elsewhere:1", clock=virtual) == "elsewhere:1"
    with pytest.raises(Unavailable, match="another reconcile is running"):
        with locks.held(conn, "reconcile", ttl_s=60, clock=virtual):
            pass
    virtual.advance(61)
    with locks.held(conn, "reconcile", ttl_s=60, clock=virtual) as lease:
        assert lease.holder == f"{socket.gethostname()}:{os.getpid()}"


def test_the_system_clock_is_the_default(conn):
    before = clock.SYSTEM.now()
    with locks.held(conn, "launch", ttl_s=600) as lease:
        expiry = clock.from_iso(expires_at(conn, "launch"))
        assert before + timedelta(seconds=600) <= expiry <= clock.SYSTEM.now() + timedelta(seconds=600)
        assert lease.clock is clock.SYSTEM
