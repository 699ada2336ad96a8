"""The boot script a launched machine runs (vast's `onstart`), what it needs, and fitting it into vast's limit.

The default is the template shipped in the package (`templates/onstart.sh`,
also at `jobs/onstart.sh`); `launch.onstart` in the config replaces it. It
carries no values of its own: `launch.vastctl_source`, `launch.install`,
`launch.bench_count`, `launch.bench_concurrency` and `launch.orphan_after` reach it
as VASTCTL_PIP, VASTCTL_INSTALL, VASTCTL_BENCH_COUNT, VASTCTL_BENCH_CONCURRENCY and
VASTCTL_ORPHAN_AFTER_S in the create request's `env`, beside the per-machine values.

The shipped script needs three programs on the machine: vastctl (to report),
curio (`curio fetch-params`) and cuzk with cuzk-bench (the prover and its
benchmark). The default image is a bare CUDA toolkit with none of them, so a
launch with the default image must say where each comes from, or it would pay
for a machine whose boot cannot work.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import math
from importlib import resources

from vastctl.config import DEFAULT_IMAGE, LaunchSection
from vastctl.errors import BadInput

MAX_CHARS = 4048  # vast's limit on the onstart field
TEMPLATE = "templates/onstart.sh"


def default_script() -> str:
    return resources.files("vastctl.machine").joinpath(TEMPLATE).read_text(encoding="utf-8")


def for_vast(script: str) -> str:
    """The script as sent: unchanged when it fits, else gzip+base64 inside a short unpacking wrapper, else (too
    long even packed) a short loader that fetches it from the manager, pinned by its sha256."""
    if len(script) <= MAX_CHARS:
        return script
    packed = base64.b64encode(gzip.compress(script.encode("utf-8"), mtime=0)).decode("ascii")
    wrapper = (
        "#!/bin/sh\n# vastctl boot script, gzip+base64 (it is longer than vast's onstart limit)\n"
        f"echo '{packed}' | base64 -d | gunzip > /tmp/vastctl-onstart.sh && exec bash /tmp/vastctl-onstart.sh\n"
    )
    if len(wrapper) <= MAX_CHARS:
        return wrapper
    return loader(script)


def loader(script: str) -> str:
    """What vast runs when the boot script is too long even packed: fetch it from the manager
    (`GET /v1/instances/UUID/onstart` with the machine's own token, retried while the manager does not answer),
    check it is byte for byte the script this launch was made with, and run it.

    The sha256 pins the script: a changed `launch.onstart` or another vastctl version on the manager, or
    anything in between, gives a machine that stops here instead of running a script nobody launched it with.
    The dead-man switch starts here, before the script's own: a manager that has not answered at all for
    launch.orphan_after (VASTCTL_ORPHAN_AFTER_S), or answers 409 (the machine was killed), gets a machine that
    destroys its own instance with CONTAINER_API_KEY instead of one that waits, billing, for nobody.
    """
    digest = hashlib.sha256(script.encode("utf-8")).hexdigest()
    return LOADER.replace("@DIGEST@", digest)


LOADER = """#!/bin/bash
# vastctl boot script, fetched from the manager (too long for vast's onstart limit even packed);
# runs only if its sha256 is the one pinned at launch
f=/tmp/vastctl-onstart.sh u="$VASTCTL_SERVER/v1/instances/$VASTCTL_UUID/onstart"
get() { if command -v curl >/dev/null; then curl -sS --max-time 30 -H "Authorization: Bearer $VASTCTL_TOKEN" \\
 -o "$f.part" -w '%{http_code}' "$u"; else python3 -c 'import os,sys,urllib.request as r
q=r.Request(sys.argv[1], headers={"Authorization": "Bearer " + os.environ["VASTCTL_TOKEN"]})
try: open(sys.argv[2], "wb").write(r.urlopen(q, timeout=30).read()); print(200)
except r.HTTPError as e: print(e.code)
except Exception: print("000")' "$u" "$f.part"; fi; }
# the dead-man switch: no answer at all (any status is one) for VASTCTL_ORPHAN_AFTER_S, or a 409: destroy itself
t=$(date +%s) o=${VASTCTL_ORPHAN_AFTER_S:-14400}
until c=$(get 2>/dev/null); [ "$c" = 200 ]; do
  case "$c" in 409) break ;; 000|'') [ "$o" -gt 0 ] 2>/dev/null && [ $(($(date +%s) - t)) -ge "$o" ] && break ;;
  *) t=$(date +%s) ;; esac; sleep "${VASTCTL_LOADER_RETRY_S:-10}"  # an answer just heard is never an orphan's
done
if [ "$c" != 200 ]; then
  d="${VASTCTL_VAST_URL:-https://console.vast.ai}/api/v0/instances/${CONTAINER_ID:-}/"
  echo "vastctl: no boot script from $u (last answer ${c:-none}): destroying this instance" >&2
  [ -n "${CONTAINER_ID:-}" ] && [ -n "${CONTAINER_API_KEY:-}" ] && for i in 1 2 3; do
    python3 -c 'import os,sys,urllib.request as r; r.urlopen(r.Request(sys.argv[1], b"{}", {"Authorization": "Bearer "
 + os.environ["CONTAINER_API_KEY"], "Content-Type": "application/json"}, method="DELETE"), timeout=30)' "$d" && break
    sleep 20; done; exit 1
fi
echo "@DIGEST@  $f.part" | sha256sum -c --status && mv "$f.part" "$f" && exec bash "$f"
echo "vastctl: no boot script with the pinned sha256 from $u" >&2; exit 1
"""


def full_script(configured: str) -> str:
    """The boot script a launch runs, before packing: the configured one, else the shipped template."""
    return configured if configured.strip() else default_script()


def script_for(configured: str) -> str:
    """What a launch sends: the configured script, else the shipped template, packed to fit."""
    return for_vast(full_script(configured))


def boot_env(launch: LaunchSection) -> dict[str, str]:
    """What the shipped script reads from the config, as environment (launch.env may still override it)."""
    env = {}
    if launch.vastctl_source.strip():
        env["VASTCTL_PIP"] = launch.vastctl_source.strip()
    if launch.install.strip():
        env["VASTCTL_INSTALL"] = launch.install.strip()
    env["VASTCTL_BENCH_COUNT"] = str(launch.bench_count)
    env["VASTCTL_BENCH_CONCURRENCY"] = str(launch.bench_concurrency)
    env["VASTCTL_ORPHAN_AFTER_S"] = str(math.ceil(launch.orphan_after))  # the dead-man switch; 0: off
    env["VASTCTL_SECTOR_SIZE"] = launch.sector_size  # what `curio fetch-params` fetches and the bench proves
    if launch.params_mirror.strip():
        env["IPFS_GATEWAY"] = launch.params_mirror.strip()  # curio fetch-params: GET $IPFS_GATEWAY<CID>
    if launch.bench_input.strip():
        env["VASTCTL_C1_URL"] = launch.bench_input.strip()
    return env


def boot_problems(launch: LaunchSection) -> list[str]:
    """Why the shipped boot script cannot work with this launch config (empty when it can, as far as we can tell).

    A custom `launch.onstart` or `launch.image` is trusted: only the operator knows what it holds.
    """
    env = {**boot_env(launch), **launch.env}
    if launch.onstart.strip():
        return []
    problems = []
    if env.get("VASTCTL_SECTOR_SIZE") != "32GiB" and not env.get("VASTCTL_C1_URL") and not env.get("VASTCTL_BENCH_CMD"):
        problems.append(f"set launch.bench_input to the URL of a {launch.sector_size} sector's C1 output for the"
                        " bench (only a 32 GiB one is published)")
    if launch.image != DEFAULT_IMAGE:
        return problems
    if not env.get("VASTCTL_PIP"):
        problems.append("set launch.vastctl_source to where the machine installs vastctl from"
                        " (a pip requirement, e.g. git+https://github.com/OWNER/vastctl@v0.1.0)")
    if not env.get("VASTCTL_INSTALL"):
        problems.append("set launch.install to a command that installs curio, cuzk and cuzk-bench (see the README,"
                        " 'What a rented machine needs')")
    return problems


def check_boot(launch: LaunchSection) -> None:
    """Refuse a launch whose boot cannot work, before any key is read or money spent."""
    problems = boot_problems(launch)
    if problems:
        raise BadInput(f"launch.image {launch.image} has no vastctl, curio or cuzk, so a machine launched with it"
                       f" could not boot: {'; and '.join(problems)}; or set launch.image to an image that has them")
