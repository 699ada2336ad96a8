"""The boot script a launched machine runs (vast's `onstart`), and fitting it into vast's size limit.

The default is the template shipped in the package (`templates/onstart.sh`,
also at `jobs/onstart.sh`); `launch.onstart` in the config replaces it. It
carries no per-machine values: those travel in the create request's `env`.
"""

from __future__ import annotations

import base64
import gzip
from importlib import resources

from .errors import BadInput

MAX_CHARS = 4048  # vast's limit on the onstart field
TEMPLATE = "templates/onstart.sh"


def default_script() -> str:
    return resources.files("vastctl").joinpath(TEMPLATE).read_text(encoding="utf-8")


def for_vast(script: str) -> str:
    """The script as sent: unchanged when it fits, else gzip+base64 inside a short unpacking wrapper."""
    if len(script) <= MAX_CHARS:
        return script
    packed = base64.b64encode(gzip.compress(script.encode("utf-8"), mtime=0)).decode("ascii")
    wrapper = (
        "#!/bin/sh\n# vastctl boot script, gzip+base64 (it is longer than vast's onstart limit)\n"
        f"echo '{packed}' | base64 -d | gunzip > /tmp/vastctl-onstart.sh && exec bash /tmp/vastctl-onstart.sh\n"
    )
    if len(wrapper) > MAX_CHARS:
        raise BadInput(f"launch.onstart is too long even compressed ({len(wrapper)} > {MAX_CHARS} characters):"
                       " shorten it, or fetch the rest from the script")
    return wrapper


def script_for(configured: str) -> str:
    """What a launch sends: the configured script, else the shipped template, packed to fit."""
    return for_vast(configured if configured.strip() else default_script())
