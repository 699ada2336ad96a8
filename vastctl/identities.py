"""A new machine's uuid: random (as uuid4), drawn from a seeded source while a simulated day runs.

Where two machines tie on everything a decision weighs (the same price, the same rate), the decision breaks the tie
by label so that it is the same every time on the same observation; a simulated day's labels come from its seed, so
the same seed gives the same day (demo/day.py), not one that differs wherever such a tie fell the other way.
"""

from __future__ import annotations

import random
import uuid
from contextlib import contextmanager
from typing import Iterator

_source: random.Random = random.SystemRandom()


def new_uuid() -> str:
    """A version-4 uuid from the current source (os.urandom outside a simulated day, as uuid.uuid4)."""
    return str(uuid.UUID(int=_source.getrandbits(128), version=4))


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """New uuids drawn from `seed` until the block ends (a simulated day in this process), then random again."""
    global _source
    before = _source
    _source = random.Random(f"vastctl identities {seed}")
    try:
        yield
    finally:
        _source = before
