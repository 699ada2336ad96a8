"""The vast client's wire in tests: a base URL and key, a clock that records each backoff sleep, a call that hangs
until its read timeout on virtual time, and a create request."""

from __future__ import annotations

from datetime import datetime, timezone

import requests

from vastctl.clock import VirtualClock
from vastctl.providers.base import CreateRequest

BASE = "https://vast.test"
KEY = "sekrit-key-0123456789"


class RecordingClock(VirtualClock):
    """Virtual time that also remembers each backoff sleep."""

    def __init__(self, start: datetime = datetime(2026, 11, 30, tzinfo=timezone.utc)):
        super().__init__(start)
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        super().sleep(seconds)


def hang(clock):
    """A call that hangs until its read timeout, on virtual time."""
    def callback(request):
        timeout = request.req_kwargs["timeout"]
        clock.advance(timeout[1] if isinstance(timeout, tuple) else timeout)
        raise requests.ReadTimeout("read timed out")
    return callback


def create_request():
    return CreateRequest(offer_id=555, image="img:1", disk_gb=150, label="vastctl-abc", onstart="echo hi",
                         env={"VASTCTL_UUID": "u", "FOO": "bar"})
