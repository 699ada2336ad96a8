"""One typed Config from the YAML file, the environment and built-in defaults.

Precedence: command-line flag > environment > config file > default. Flags are
applied by the CLI on top of what `load()` returns. Every key is optional; an
unknown key or a bad value is a BadInput naming the key, so a typo never
silently falls back to a default that spends money.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeVar

from vastctl import config_file, validate
from vastctl.errors import BadInput
from vastctl.validate import DAY_S, MAX_INT, Invalid, Range

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Section = TypeVar("_Section", bound="DataclassInstance")  # Config or one of its sections

DURATION = {"duration": True}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any, key: str = "duration") -> float:
    """`90s`, `30m`, `2h`, `1d` or a number of seconds → seconds."""
    if isinstance(value, bool):
        raise BadInput(f"{key}: expected a duration like 90s, 30m or 2h, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = validate.number(value) or 0.0  # an int or a float: never None (an int past range is inf)
    else:
        match = _DURATION_RE.match(str(value))
        if not match:
            raise BadInput(f"{key}: expected a duration like 90s, 30m or 2h, got {value!r}")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if validate.real(seconds) is None or seconds < 0:
        raise BadInput(f"{key}: a duration must be a finite number of seconds ≥ 0, got {value!r}")
    return seconds


_NO_LAUNCH = "0 would refuse every launch (to pause launches, set max_instances 0)"
_POSITIVE_DURATION = Range(0, 365 * DAY_S, above=True)
# Every number's range by its dotted key; a key not listed takes its kind's default below.
RANGES: dict[str, Range] = {
    "fleet.target_proofs_per_hour": Range(0, 1e7),
    "fleet.min_bench_rate": Range(0, 1e6),
    "fleet.max_instances": Range(0, 10_000),
    "fleet.max_hourly_spend": Range(0, 1e6, above=True, why=_NO_LAUNCH),
    "fleet.max_daily_spend": Range(0, 1e7, above=True, why=_NO_LAUNCH),
    "fleet.max_dph": Range(0, 1000, above=True, why=_NO_LAUNCH),
    "fleet.default_rate": Range(0, 1e6),
    "fleet.min_cpu_ram_gb": Range(0, 1e5),
    "fleet.min_inet_down_mbps": Range(0, 1e6),
    "launch.disk_gb": Range(0, 1e5, above=True),
    "tunnel.ssh_port": Range(1, 65535),  # TCP ports
    "tunnel.first_port": Range(1, 65535),
    "tunnel.last_port": Range(1, 65535),
    "launch.bench_count": Range(1, 1000),  # a benchmark of no proof measures nothing
    "launch.bench_concurrency": Range(1, 1000),
    "timeouts.launching": _POSITIVE_DURATION,
    "timeouts.registered": _POSITIVE_DURATION,
    "timeouts.params_done": _POSITIVE_DURATION,
    "timeouts.bench_done": _POSITIVE_DURATION,
    "timeouts.heartbeat": _POSITIVE_DURATION,
    "reconcile.disappear_confirmations": Range(1, 100),
    "reconcile.max_vanish_fraction": Range(0, 1),
    "reconcile.deadline": Range(0, 3600, above=True, why="0 would stop every pass before it asks vast anything"),
    "agent.interval": _POSITIVE_DURATION,
    "agent.max_actions_per_step": Range(0, 1000),
    "agent.min_machines": Range(0, 10_000),
    "agent.max_context_tokens": Range(1000, 1_000_000),
    "agent.headroom": Range(0, 10),
    "agent.max_rounds": Range(1, 100),
    "agent.deadline": Range(0, 3600, above=True, why="0 would end every step before it asks the model"),
    "demand.stale_after": _POSITIVE_DURATION,
    "route.max_held": Range(1, 100_000),
    "route.max_held_mb": Range(1, 1_000_000),
    "route.max_retries": Range(0, 100),
    "route.cut_through_mb": Range(0, 129),
    "route.fail_threshold": Range(1, 1000),
    "route.ejection_base": _POSITIVE_DURATION,
    "route.max_ejected_percent": Range(0, 100),
    "route.refresh": _POSITIVE_DURATION,
}
DEFAULT_RANGES = {"int": Range(0, MAX_INT), "float": Range(0, 1e15), "duration": Range(0, 365 * DAY_S)}


def range_of(key: str, kind: str) -> Range:
    """The allowed values of the number at dotted `key` (e.g. `fleet.max_instances`); `kind` is int, float or duration."""
    return RANGES.get(key) or DEFAULT_RANGES[kind]


@dataclass
class VastSection:
    label_prefix: str = "vastctl-"
    blocklist_ttl: float = field(default=24 * 3600, metadata=DURATION)


@dataclass
class FleetSection:
    target_proofs_per_hour: float = 0.0
    min_bench_rate: float = 40.0
    max_instances: int = 10
    max_hourly_spend: float = 10.0
    max_daily_spend: float = 240.0  # spent since 00:00 UTC plus the next hour's spend (guard.py)
    max_dph: float = 1.0
    default_rate: float = 60.0
    gpus: list[str] = field(default_factory=lambda: ["RTX 4090", "RTX 5090"])
    min_cpu_ram_gb: float = 256.0
    min_inet_down_mbps: float = 500.0


DEFAULT_IMAGE = "nvidia/cuda:12.8.1-devel-ubuntu24.04"  # CUDA toolkit only: no vastctl, curio or cuzk


@dataclass
class LaunchSection:
    image: str = DEFAULT_IMAGE
    disk_gb: float = 150.0
    onstart: str = ""
    env: dict[str, str] = field(default_factory=dict)
    vastctl_source: str = ""  # pip requirement the boot script installs vastctl from; empty: the image has it
    install: str = ""  # shell command the boot script runs to install curio and cuzk; empty: the image has them
    bench_count: int = 5  # proofs the benchmark times, after one warm-up proof (the gate's calibration)
    bench_concurrency: int = 5  # proofs in flight at once (`cuzk-bench batch -j`): 5 is the published setting
    join: str = "none"  # how a benched machine reaches Curio: none (the image's own network), ssh (tunnel:), command
    join_command: str = ""  # launch.join command: what the boot script runs to join, before it reports running
    # the machines' dead-man switch: a machine that has had no answer from the manager for this long destroys
    # itself (docs/deployment.md "When the manager is gone"); 0 turns it off
    orphan_after: float = field(default=4 * 3600, metadata=DURATION)
    # on-demand (vast never pauses it), interruptible (a bid of the offer's min_bid + bid_margin, never above
    # max_dph: cheaper, but vast pauses it when outbid) or mixed (interruptible_share of the fleet bids)
    rental: str = "on-demand"
    interruptible_share: float = 0.75  # launch.rental mixed: the share of the live fleet rented interruptible
    bid_margin: float = 0.1  # an interruptible create bids the offer's min_bid × (1 + this)
    # where machines fetch the proving parameters: an HTTP(S) prefix that answers GET <prefix><CID> (the
    # machine's IPFS_GATEWAY, which curio fetch-params reads); empty: Curio's public default
    params_mirror: str = ""
    sector_size: str = "32GiB"  # the sectors the fleet proves: the parameters fetched, the bench's input, demand
    bench_input: str = ""  # URL of the C1 output the bench proves; empty: the published 32 GiB one (64GiB: needed)


@dataclass
class TimeoutsSection:
    launching: float = field(default=20 * 60, metadata=DURATION)
    registered: float = field(default=30 * 60, metadata=DURATION)
    params_done: float = field(default=90 * 60, metadata=DURATION)
    bench_done: float = field(default=30 * 60, metadata=DURATION)
    heartbeat: float = field(default=10 * 60, metadata=DURATION)


@dataclass
class ReconcileSection:
    disappear_confirmations: int = 2
    max_vanish_fraction: float = 0.5
    deadline: float = field(default=50.0, metadata=DURATION)  # a pass stops calling vast after this (cron: 1 min)
    confirm_after: float = field(default=60.0, metadata=DURATION)  # vast's dead/missing word must hold this long


@dataclass
class AgentSection:
    policy: str = "auto"
    model: str = "claude-haiku-5-5"
    interval: float = field(default=5 * 60, metadata=DURATION)
    max_actions_per_step: int = 5
    min_machines: int = 0  # a floor of warm machines (running or booting) the agent keeps whatever the queue says
    max_context_tokens: int = 12000
    headroom: float = 0.15
    # rules: capacity above what is wanted stands this long (since the last machine came up, and since the work
    # ran out) before it is released: the scale-down delay of the two-way sizing
    scale_down_after: float = field(default=5 * 60, metadata=DURATION)
    max_wait: float = field(default=45 * 60, metadata=DURATION)  # the service: a proof done this long after arriving
    plan_horizon: float = field(default=40 * 60, metadata=DURATION)  # rules: drain the queue within this (< max_wait)
    scale_down_margin: float = 0.0  # rules: release while queued only if what is left covers wanted × (1 + margin)
    max_releases_per_step: int = 2  # rules: machines released in one step while work is queued
    replace_factor: float = 1.3  # rules: a machine this many times dearer per proof than a cheaper host is replaced
    replace_after: float = field(default=2 * 3600, metadata=DURATION)  # rules: ... once it has run this long
    outbid_wait: float = field(default=10 * 60, metadata=DURATION)  # rules: an outbid machine is waited for this long, then rebid or released
    max_rounds: int = 8
    deadline: float = field(default=50.0, metadata=DURATION)
    prices: dict[str, list[float]] = field(default_factory=lambda: {"claude-haiku-5-5": [0.10, 0.50, 0.01, 0.125]}, metadata={"prices": True})


@dataclass
class DemandSection:
    command: str = ""
    stale_after: float = field(default=15 * 60, metadata=DURATION)
    lookahead_window: float = field(default=75 * 60, metadata=DURATION)  # `lookahead` counts arrivals within this


@dataclass
class ServerSection:
    url: str = ""
    admin_token: str = ""
    secret_file: str = ""
    metrics_token: str = ""
    trusted_proxy: str = ""  # address(es) of the TLS proxy whose X-Forwarded-Proto the dashboard believes
    webhook_secret_file: str = ""  # vast's webhook signing secrets, one a line; empty: beside the state file
    webhook_tolerance: float = field(default=300.0, metadata=DURATION)  # a delivery's timestamp this far off is refused
    webhook_min_interval: float = field(default=10.0, metadata=DURATION)  # between the starts of two wakes
    webhook_confirm_after: float = field(default=5.0, metadata=DURATION)  # the second listing a kill needs


@dataclass
class TunnelSection:
    """launch.join ssh: each machine opens a reverse tunnel to the manager's 127.0.0.1:PORT (vastctl/facts/tunnel.py)."""

    host: str = ""  # the manager's address as the machines dial it
    ssh_port: int = 22
    user: str = "vastctl-tunnel"  # the tunnel account (jobs/sshd-vastctl-tunnel.conf)
    authorized_keys: str = "/var/lib/vastctl-tunnel/authorized_keys"  # written by vastctl, read by sshd
    keys_reader: str = "nobody"  # sshd's AuthorizedKeysCommandUser: who must be able to read authorized_keys
    host_key_file: str = "/etc/ssh/ssh_host_ed25519_key.pub"  # the manager's host key the machines pin
    first_port: int = 20000  # the range the machines' ports come from, both ends included
    last_port: int = 20999
    down_timeout: float = field(default=10 * 60, metadata=DURATION)  # a running machine unreachable this long dies
    check_timeout: float = field(default=3.0, metadata=DURATION)  # one probe of a machine through its tunnel


@dataclass
class ProversSection:
    """`vastctl provers`: the upstream file nginx balances Curio's gRPC over (vastctl/facts/provers.py)."""

    upstream_file: str = ""  # e.g. /etc/nginx/vastctl/cuzk-upstream.conf; empty: not written
    reload_command: str = ""  # run after the file changed, e.g. `nginx -s reload`


@dataclass
class RouteSection:
    """`vastctl route`: the proof router Curio's `[Cuzk] Address` points at (vastctl/route/, docs/joining-curio.md)."""

    listen: str = "127.0.0.1:9820"  # host:port the router serves cuzk.v1.ProvingEngine on, plaintext as cuzk does
    max_held: int = 200  # calls waiting for a free prover slot, at most; past it a new call is refused
    max_held_mb: int = 4096  # memory for requests (kept: 3x a call's size; being read: 416 MiB); past it calls wait unread
    max_retries: int = 3  # times a call a prover dropped is sent again to another prover
    cut_through_mb: int = 1  # a Prove this big or bigger goes to its prover as it arrives (kept whole for a resend)
    # a prover failing this many calls in a row (dropped, failed, held to their deadline; or connects) is ejected
    fail_threshold: int = 3
    # an ejection lasts this × the times it was ejected since its last good answer; then the prover is back
    ejection_base: float = field(default=30.0, metadata=DURATION)
    max_ejected_percent: int = 10  # at most this share of the joined provers is ejected at once (at least one)
    own_daemon: str = ""  # your own cuzk daemon (host:port): SnapDeals, WinningPoSt and WindowPoSt go there, unheld
    unverified_to_fleet: list[str] = field(default_factory=list)  # kinds Curio does not verify sent to the fleet anyway
    post_address: str = ""  # deprecated: own_daemon's old name (it took WindowPoSt and WinningPoSt only)
    drain_timeout: float = field(default=5 * 60, metadata=DURATION)  # on SIGTERM, calls in flight get this long
    refresh: float = field(default=2.0, metadata=DURATION)  # how often the joined provers are read from the state file


@dataclass
class SimSection:
    seed: int = 1
    failures: str = "default"


_CHOICES = {
    ("root", "provider"): ("vast", "sim"),
    ("agent", "policy"): ("auto", "rules", "llm", "plan"),
    ("sim", "failures"): ("low", "default", "high"),
    ("launch", "join"): ("none", "ssh", "command"),
    ("launch", "sector_size"): ("32GiB", "64GiB"),
    ("launch", "rental"): ("on-demand", "interruptible", "mixed"),
    ("route", "unverified_to_fleet"): ("snap", "winning_post"),  # a list: each item one of these
}


@dataclass
class Config:
    db: str = ""
    provider: str = "vast"
    vast: VastSection = field(default_factory=VastSection)
    fleet: FleetSection = field(default_factory=FleetSection)
    launch: LaunchSection = field(default_factory=LaunchSection)
    timeouts: TimeoutsSection = field(default_factory=TimeoutsSection)
    reconcile: ReconcileSection = field(default_factory=ReconcileSection)
    agent: AgentSection = field(default_factory=AgentSection)
    demand: DemandSection = field(default_factory=DemandSection)
    server: ServerSection = field(default_factory=ServerSection)
    tunnel: TunnelSection = field(default_factory=TunnelSection)
    provers: ProversSection = field(default_factory=ProversSection)
    route: RouteSection = field(default_factory=RouteSection)
    sim: SimSection = field(default_factory=SimSection)
    source: str = field(default="", metadata={"internal": True})

    @property
    def db_path(self) -> Path:
        return Path(self.db).expanduser()

    @property
    def secret_path(self) -> Path:
        """The HMAC secret for machine tokens: configured, else beside the state file."""
        if self.server.secret_file:
            return Path(self.server.secret_file).expanduser()
        return self.db_path.with_name(self.db_path.name + ".secret")

    @property
    def webhook_secret_path(self) -> Path:
        """vast's webhook signing secrets: configured, else beside the state file (missing: webhooks off)."""
        if self.server.webhook_secret_file:
            return Path(self.server.webhook_secret_file).expanduser()
        return self.db_path.with_name(self.db_path.name + ".webhook-secret")


def default_config_path(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME", "~")).expanduser() / ".config" / "vastctl" / "config.yaml"


def default_db_path(env: Mapping[str, str]) -> str:
    data_home = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "share")
    return str(Path(data_home) / "vastctl" / "vastctl.db")


def load(path: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the config (explicit path, else $VASTCTL_CONFIG, else the default file if it exists).

    An explicitly named file that does not exist is an error; a missing default
    file just means built-in defaults.
    """
    env = os.environ if env is None else env
    explicit = path or env.get("VASTCTL_CONFIG")
    config_path = Path(explicit).expanduser() if explicit else default_config_path(env)
    raw: dict[str, Any] = {}
    if explicit and not config_path.is_file():
        raise BadInput(f"config file {config_path} not found: fix VASTCTL_CONFIG or --config")
    if config_path.is_file():
        raw = config_file.read_yaml(config_path)
    try:
        config = from_mapping(raw)
    except BadInput as exc:  # the key's file, so an operator with several configs knows which to fix
        raise BadInput(f"config file {config_path}: {exc}") from None
    config.source = str(config_path) if config_path.is_file() else ""
    if env.get("VASTCTL_DB"):
        config.db = env["VASTCTL_DB"]
    if env.get("VASTCTL_ADMIN_TOKEN", "").strip():  # as VAST_API_KEY: a secret kept in the environment file
        config.server.admin_token = env["VASTCTL_ADMIN_TOKEN"].strip()
    if not config.db:
        config.db = default_db_path(env)
    return config


def admin_token_file(db_path: Path) -> Path:
    """Where a state file's own admin token lives, beside it (what `demo --keep` leaves for its dashboard)."""
    return Path(f"{db_path}.admin-token")


def admin_token_beside(config: Config) -> None:
    """server.admin_token from the file beside the state file, when neither the config nor VASTCTL_ADMIN_TOKEN
    set one: a kept demo day opens its dashboard with no config written by hand."""
    if config.server.admin_token:
        return
    try:
        token = admin_token_file(config.db_path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):  # none there (the usual case), or not ours to read
        return
    config.server.admin_token = token


def from_mapping(raw: Mapping[str, Any]) -> Config:
    """Build a Config from a parsed YAML mapping, validating every key and value."""
    config = _build(Config, raw, prefix="")
    if config.tunnel.first_port > config.tunnel.last_port:
        raise BadInput(f"config keys tunnel.first_port ({config.tunnel.first_port}) and tunnel.last_port"
                       f" ({config.tunnel.last_port}) make an empty range: first_port must be ≤ last_port")
    if config.launch.join == "command" and not config.launch.join_command.strip():
        raise BadInput("config key launch.join is command but launch.join_command is empty: set the command the"
                       " boot script runs to join the machine, or set launch.join to none or ssh")
    _check_orphan_after(config)
    if config.agent.min_machines > config.fleet.max_instances:
        raise BadInput(f"config key 'agent.min_machines' ({config.agent.min_machines}) is above fleet.max_instances"
                       f" ({config.fleet.max_instances}): the floor could never be kept; lower it or raise"
                       " fleet.max_instances")
    for key in ("params_mirror", "bench_input"):
        value = getattr(config.launch, key).strip()
        if value and (not re.fullmatch(r"https?://[^\s'\"\\$`]+", value) or (key == "params_mirror" and not value.endswith("/"))):
            raise BadInput(f"config key 'launch.{key}' must be an http:// or https:// URL{' ending in /' if key == 'params_mirror' else ''}"
                           f" (machines fetch {'<it><CID>' if key == 'params_mirror' else 'it'}), got {value!r}")
    _check_label_prefix(config.vast.label_prefix)
    _check_route(config.route)
    _check_cuzk_memory(config.launch.env.get("VASTCTL_CUZK_MEMORY"))
    for key in ("interruptible_share", "bid_margin"):
        value = getattr(config.launch, key)
        if not 0 <= value <= 1:
            raise BadInput(f"config key 'launch.{key}' must be from 0 to 1, got {value:g}")
    return config


def _check_route(route: RouteSection) -> None:
    """route.post_address is route.own_daemon's old name: taken as it, refused when the two name different daemons."""
    own, old = route.own_daemon.strip(), route.post_address.strip()
    if own and old and own != old:
        raise BadInput(f"config keys 'route.own_daemon' ({own}) and 'route.post_address' ({old}, its old name)"
                       " name different daemons: keep route.own_daemon and remove route.post_address")
    route.own_daemon = own or old
    if route.own_daemon and not re.fullmatch(r"\S+:[0-9]{1,5}", route.own_daemon):
        raise BadInput(f"config key 'route.{'own_daemon' if own else 'post_address'}' must be your own cuzk daemon's"
                       f" host:port (e.g. 10.0.0.5:9820), got {validate.shown(route.own_daemon)}")


CUZK_SIZE_RE = re.compile(r" *(?:[1-9][0-9]{0,6} *(?:GiB|MiB|GB|MB)|[1-9][0-9]{0,15}) *")  # the boot script's check


def _check_cuzk_memory(value: str | None) -> None:
    """cuzk reads total_budget as exactly `auto` or a whole size (GiB, MiB, GB, MB, bytes) and silently turns
    anything else into 50 GiB: refused before a machine is rented with it."""
    if value is not None and value != "auto" and not CUZK_SIZE_RE.fullmatch(value):
        raise BadInput(f"config key 'launch.env.VASTCTL_CUZK_MEMORY' must be auto or a whole size cuzk reads"
                       f" (e.g. 256GiB, 200000MiB, 256GB), got {validate.shown(value)}: cuzk would run on 50 GiB")


LABEL_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


def _check_label_prefix(prefix: str) -> None:
    """The prefix starts every label we write (vast's listing, nginx's upstream file, tables): plain characters only,
    so no newline or control can break out of where a label is written."""
    if prefix and not LABEL_PREFIX_RE.fullmatch(prefix):
        raise BadInput(f"config key 'vast.label_prefix' must be 1 to 40 letters, digits, '.', '_' or '-' (starting"
                       f" with a letter or digit), got {validate.shown(prefix)}: e.g. vastctl-")


def _check_orphan_after(config: Config) -> None:
    """A healthy machine is silent for at most one boot stage (reconcile kills it past the stage's timeout):
    a dead-man switch shorter than that would destroy machines the manager still wants."""
    orphan_after = config.launch.orphan_after
    stages = {f.name: getattr(config.timeouts, f.name) for f in dataclasses.fields(config.timeouts)}
    longest = max(stages, key=lambda name: stages[name])
    if 0 < orphan_after <= stages[longest]:
        raise BadInput(f"config key 'launch.orphan_after' ({orphan_after:g}s) must be longer than every timeouts.*"
                       f" (timeouts.{longest} is {stages[longest]:g}s): a machine silent that long while booting is"
                       " still wanted; raise it (default 4h), or set 0 to turn the dead-man switch off")


def _build(cls: type[_Section], raw: Mapping[str, Any], prefix: str) -> _Section:
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    values = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if key not in fields:
            known = ", ".join(sorted(fields))
            nearest = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f"did you mean {prefix + nearest[0]!r}? " if nearest else ""
            raise BadInput(f"config key {name!r} is unknown ({hint}known here: {known})")
        try:
            values[key] = _convert(fields[key], value, name, prefix)
        except Invalid as exc:  # the validator's refusal, named as the config file names it
            raise BadInput(exc.worded(f"config key {name!r}")) from None
    return cls(**values)


def _prices(value: Any, name: str) -> dict[str, list[float]]:
    """model → [input, output, cache_read, cache_write] $ per million tokens."""
    if not isinstance(value, dict):
        raise BadInput(f"config key {name!r} must map a model name to [input, output, cache_read, cache_write]")
    prices = {}
    for model, row in value.items():
        ok = isinstance(row, list) and len(row) == 4 and all(_price(x) for x in row)
        if not ok:
            raise BadInput(f"config key {name}.{model}: expected [input, output, cache_read, cache_write]"
                           f" $ per million tokens, got {row!r}")
        prices[str(model)] = [float(x) for x in row]
    return prices


def _price(value: Any) -> bool:
    """A price: a finite number ≥ 0 (YAML's 400-digit integer included, as infinite)."""
    try:
        validate.finite(value, "price")
    except Invalid:
        return False
    return True


def _convert(f: dataclasses.Field[Any], value: Any, name: str, prefix: str) -> Any:
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if dataclasses.is_dataclass(default) and not isinstance(default, type):  # a section's instance
        if value is None:
            return default
        if not isinstance(value, dict):
            raise BadInput(f"config key {name!r} must be a mapping of keys")
        return _build(type(default), value, prefix=f"{name}.")
    if f.metadata.get("duration"):
        seconds = parse_duration(value, name)
        return range_of(name, "duration").check(seconds, name, "duration", value)
    if f.metadata.get("prices"):
        return _prices(value, name)
    if isinstance(default, (bool, int, float)):
        return _number(default, value, name)
    section = prefix.rstrip(".") or "root"
    return _text(default, value, name, _CHOICES.get((section, f.name)))


def _number(default: bool | int | float, value: Any, name: str) -> bool | int | float:
    """A flag or a number, of its default's type (a bool is no int here) and within its key's range."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise BadInput(f"config key {name!r} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise range_of(name, "int").refusal(name, "int", value)
        range_of(name, "int").check(value, name, "int", value)
        return value
    number = validate.real(value)
    if number is None:
        raise range_of(name, "float").refusal(name, "float", value)
    return range_of(name, "float").check(number, name, "float", value)


def _text(default: Any, value: Any, name: str, choices: Sequence[str] | None) -> Any:
    """A string, a list of strings or a mapping of strings, of its default's type, among its key's choices."""
    if isinstance(default, str):
        if value is None:
            return ""
        if not isinstance(value, str):
            raise BadInput(f"config key {name!r} must be a string, got {value!r}")
        if choices and value not in choices:
            raise BadInput(f"config key {name!r} must be one of {', '.join(choices)}, got {value!r}")
        return value
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise BadInput(f"config key {name!r} must be a list of strings, got {value!r}")
        if choices and not set(value) <= set(choices):
            raise BadInput(f"config key {name!r} may list only {', '.join(choices)}, got {validate.shown(value)}")
        return value
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise BadInput(f"config key {name!r} must be a mapping, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    raise BadInput(f"config key {name!r} has an unsupported value {value!r}")  # pragma: no cover
