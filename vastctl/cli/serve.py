"""The manager's HTTP endpoint (`serve`) and the machine tokens it checks (`token`)."""

from __future__ import annotations

import collections
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from vastctl import markets, validate
from vastctl.cli.app import Globals, app, globals_of, say
from vastctl.errors import BadInput, Refused
from vastctl.state import tokens

if TYPE_CHECKING:
    from types import FrameType

    from vastctl.config import Config


@app.command("serve")
def serve_cmd(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to bind; keep loopback, TLS in front.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0 picks a free one).")] = 8080,
    threads: Annotated[int, typer.Option(
        "--threads", min=1, max=64, help="Worker threads (reports all write one file: 1 is fastest).")] = 1,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, help="Seconds a connection is kept without a byte from its client.")] = 30.0,
    request_timeout: Annotated[float, typer.Option(
        "--request-timeout", min=0.1,
        help="Seconds a request may take to arrive in full, however slowly it trickles.")] = 10.0,
    connection_limit: Annotated[int, typer.Option(
        "--connection-limit", min=1, max=100_000,
        help="Open connections served at once; more wait in the listen queue.")] = 1000,
    access_log: Annotated[bool, typer.Option(
        "--access-log/--no-access-log", help="Log each request (never its headers).")] = True,
    as_of: Annotated[str | None, typer.Option(
        "--as-of", help="Show the state file as it stood at this UTC time (e.g. 2031-03-03T12:00:00Z), as `vastctl"
                        " --as-of TIME cost` and `fleet` read it: a copy, so nothing sent to it is kept.")] = None,
) -> None:
    """Answer the boot scripts' reports over HTTP (machines set VASTCTL_SERVER and VASTCTL_TOKEN).

    Example: vastctl serve --host 127.0.0.1 --port 8080   # behind a TLS proxy
    """
    from vastctl.serving import server, webhooks

    g = globals_of(ctx)
    if as_of is not None:  # beats the root option: the page reads the file as it stood then (Globals.config)
        g.as_of = as_of
    clock = g.clock
    waker = webhooks.Waker(g.config, clock=clock)  # its market: markets.get_provider, as cron's commands build it
    srv = server.make_server(g.config, host=host, port=port, threads=threads, timeout=timeout,
                             request_timeout=request_timeout, connection_limit=connection_limit, clock=clock,
                             waker=waker)
    log_handler = _log_to_stderr(access_log)
    _say_webhooks(g)
    if not g.config.server.admin_token:
        say("GET /v1/fleet is disabled: set server.admin_token in the config to enable it")
    if not _loopback(host):
        say(f"warning: --host {host} takes connections from other machines, in plain HTTP: keep serve on"
            " 127.0.0.1 behind the TLS proxy (docs/deployment.md) so tokens never cross a network in clear")
    signal.signal(signal.SIGTERM, _interrupt)
    # Hand the GIL over after 1 ms instead of 5: each request is a few short steps between the
    # event loop, a worker and SQLite, and waiting out the default interval at each hand-off
    # was slower (bench/README.md, "serve: heartbeats per second").
    sys.setswitchinterval(0.001)
    say(f"serving on {', '.join(server.listen_urls(srv))} (state file {g.config.db_path}; stop with Ctrl-C or SIGTERM)")
    try:
        srv.run()  # returns after SIGINT/SIGTERM, once running requests have finished
    finally:
        waker.stop()
        log_handler.close()
    say("stopped")


def _say_webhooks(g: Globals) -> None:
    """Whether vast's deliveries are taken, and a warning when their wakes could not reach vast."""
    from vastctl.serving import webhooks

    path = g.config.webhook_secret_path
    if not path.exists():
        say(f"POST {webhooks.PATH} is off: no webhook secret at {path} (`vastctl webhook-secret --add` stores it)")
        return
    try:
        markets.get_provider(g.config, clock=g.clock)
    except BadInput as exc:
        say(f"warning: vast's webhooks are recorded but wake nothing until serve can reach vast: {exc}")


@app.command("webhook-secret")
def webhook_secret_cmd(
    ctx: typer.Context,
    add: Annotated[bool, typer.Option(
        "--add", help="Store the secret vast showed (read from stdin) first; the older ones keep verifying.")] = False,
    retire_old: Annotated[bool, typer.Option(
        "--retire-old", help="Drop every secret but the newest, once vast signs with it.")] = False,
) -> None:
    """Store or rotate the secret vast signs its webhook deliveries with (server.webhook_secret_file).

    Example: vastctl webhook-secret --add < secret.txt   (rotating: --add the new one, then --retire-old)
    """
    from vastctl.serving import webhooks

    g = globals_of(ctx)
    if add == retire_old:
        raise BadInput("give one of --add (the secret on stdin) or --retire-old")
    path = g.config.webhook_secret_path
    if retire_old:
        if not path.exists():
            raise BadInput(f"no webhook secret at {path}: nothing to retire; {webhooks.NO_SECRET_FIX}")
        retired = webhooks.retire_old(path)
        say(f"retired {retired} old webhook secret(s) from {path}: only deliveries signed with the newest verify now"
            if retired else f"{path} holds one webhook secret: nothing to retire")
        return
    if sys.stdin.isatty():
        secret = typer.prompt("webhook secret (as vast showed it)", hide_input=True)
    else:
        secret = sys.stdin.readline()
    count = webhooks.add_secret(path, webhooks.check_secret(secret.strip()), now=g.clock.now())
    say(f"{path} now holds {count} webhook secret(s), newest first; a running serve verifies deliveries"
        f" with any of them from its next one" + ("" if count == 1 else
                                                   ": once vast signs with the new one, run"
                                                   " `vastctl webhook-secret --retire-old`"))


@app.command("token")
def token_cmd(
    ctx: typer.Context,
    uuid: Annotated[str | None, typer.Option("--uuid", help="Print this machine's token.")] = None,
    rotate: Annotated[bool, typer.Option(
        "--rotate", help="Add a new secret that signs every token from now on; the old ones keep verifying.")] = False,
    retire_old: Annotated[bool, typer.Option(
        "--retire-old", help="Drop every secret but the newest: tokens made under them stop working.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="With --retire-old: even while machines launched before the rotation are live.")] = False,
) -> None:
    """Print the bearer token a machine uses in remote mode (its VASTCTL_TOKEN), or rotate the secret behind them.

    Example: vastctl token --uuid 0f1c2d3e-…   (rotating: --rotate now, --retire-old once old machines are gone)
    """
    g = globals_of(ctx)
    if sum((uuid is not None, rotate, retire_old)) != 1:
        raise BadInput("give one of --uuid U (print its token), --rotate or --retire-old")
    if force and not retire_old:
        raise BadInput("--force goes with --retire-old only")
    path = _existing_secret(g.config)
    if uuid is not None:
        validate.text(uuid, "uuid")
        typer.echo(tokens.machine_token(tokens.read_secret(path), uuid))
        return
    if rotate:
        count = tokens.rotate_secret(path, now=g.clock.now())
        say(f"{path} now holds {count} secrets: new tokens use the new one and every one still verifies"
            " (a running serve picks it up at its next request). Once the machines launched before now are"
            " replaced, run `vastctl token --retire-old`.")
        return
    if tokens.newest_added(path) is not None and not force:
        conn = g.connect()
        try:
            older = tokens.live_before_rotation(conn, path)
        finally:
            conn.close()
        if older:
            shown = ", ".join(older[:5]) + (f" and {len(older) - 5} more" if len(older) > 5 else "")
            raise Refused(f"{len(older)} live machine(s) were launched before the newest secret and hold tokens"
                          f" it did not sign ({shown}): replace them first, or pass --force to cut them off")
    retired = tokens.retire_old_secrets(path)
    say(f"retired {retired} old secret(s) from {path}: only tokens signed with the newest one work now"
        if retired else f"{path} holds one secret: nothing to retire")


def _existing_secret(config: Config) -> Path:
    """The token secret file, or an error saying where it was looked for and why.

    A missing file almost always means the command ran without the manager's
    config (`sudo -u vastctl vastctl token …` finds the vastctl user's default
    paths), and `init` there would start a second state file beside the real one.
    """
    path = config.secret_path
    if path.exists():
        return path
    if config.server.secret_file:
        whence = f"server.secret_file in {config.source}"
    else:
        whence = (f"beside the state file {config.db_path}; "
                  + (f"config {config.source}" if config.source else "no config file was read"))
    raise BadInput(f"no token secret at {path} ({whence}): {tokens.NO_SECRET_FIX}")


def _loopback(host: str) -> bool:
    """Whether an address to bind reaches this machine only (a name is taken at its word only for localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class _UTCFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging.Formatter's name
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class _BatchedStream(logging.Handler):
    """Format in the request's thread, write in batches from one thread a few times a second.

    A request never waits on stderr, and the writer wakes five times a second
    rather than once a request: every wake-up is a GIL hand-off the workers
    pay for.
    """

    def __init__(self, stream: TextIO, interval: float = 0.2) -> None:
        super().__init__()
        self.stream = stream
        self.interval = interval
        self.pending: collections.deque[str] = collections.deque(maxlen=100_000)  # a stalled stderr drops, not grows
        self.stopping = threading.Event()
        self.writer = threading.Thread(target=self._write_forever, name="vastctl-log", daemon=True)
        self.writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.pending.append(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging's contract: never raise from emit
            self.handleError(record)

    def _write_forever(self) -> None:
        while not self.stopping.wait(self.interval):
            self.flush()
        self.flush()

    def flush(self) -> None:
        batch = []
        try:
            while True:
                batch.append(self.pending.popleft())
        except IndexError:
            pass
        if batch:
            try:
                self.stream.write("".join(batch))
                self.stream.flush()
            except (OSError, ValueError):  # stderr closed or gone: lose the lines, keep serving
                pass

    def close(self) -> None:
        self.stopping.set()
        self.writer.join(timeout=5)
        super().close()


def _log_to_stderr(access_log: bool) -> _BatchedStream:
    handler = _BatchedStream(sys.stderr)
    handler.setFormatter(_UTCFormatter("%(asctime)s %(levelname)s %(message)s"))
    levels = {"vastctl.serve": logging.INFO if access_log else logging.WARNING, "waitress": logging.WARNING,
              "vastctl.serve.wake": logging.INFO,  # one line a webhook's wake, access log or not
              "waitress.queue": logging.ERROR}  # waitress warns at every queued task under load: noise
    for name, level in levels.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
    return handler
