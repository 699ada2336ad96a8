"""GPU markets behind one narrow interface (base.Provider): the real vast.ai API (vast.py) and the embedded
simulated market (sim.py). They know no rows and no policy; vastctl.markets builds the one the config names.
"""

from __future__ import annotations

from typing import Any


def get_provider(*args: Any, **kwargs: Any) -> Any:
    """vastctl.markets.get_provider under its old name, for a caller not yet moved (demo.py); to be removed."""
    from ..markets import get_provider as build

    return build(*args, **kwargs)
