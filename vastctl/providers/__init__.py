"""GPU markets behind one narrow interface (base.Provider), and the one factory that picks one.

Import-light on purpose: `requests` loads only when a provider is built, so
`vastctl --help` and the boot-script commands stay fast.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import BadInput

if TYPE_CHECKING:
    from ..config import Config
    from .base import Provider


def get_provider(config: "Config", *, env: Mapping[str, str] | None = None, **options: Any) -> "Provider":
    """The market the config names (only `vast` for now).

    `options` go to the provider's constructor (e.g. `sleep=` for tests).
    Raises BadInput (exit 2) naming VAST_API_KEY when no key is configured.
    """
    env = os.environ if env is None else env
    if config.provider != "vast":
        raise BadInput(f"provider {config.provider!r} is not available in this version: set `provider: vast`")
    from .vast import VastProvider

    provider = VastProvider.from_env(env, **options)
    if provider is None:
        raise BadInput("no vast.ai API key: set VAST_API_KEY, or run `vastai set api-key KEY`"
                       " (writes ~/.config/vastai/vast_api_key)")
    return provider
