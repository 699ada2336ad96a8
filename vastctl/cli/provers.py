"""`vastctl provers`: the joined machines as Curio's gRPC upstream (nginx), kept current."""

from __future__ import annotations

import typer

from vastctl.cli.app import JsonOpt, app, echo, globals_of, print_json, print_table, say


@app.command("provers")
def provers_cmd(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Check every running machine's tunnel, list the joined ones, and rewrite nginx's upstream file if the set changed.

    The file (provers.upstream_file) is replaced atomically and only when the set of joined machines
    changed; then provers.reload_command runs. A reload that fails is one error line and exit 1, the
    previous file back in place. `reconcile` does the same after every pass.

    Example: vastctl provers --json
    """
    from vastctl import detached
    from vastctl.facts import provers, tunnel

    g = globals_of(ctx)
    conn = g.connect()
    tunnel.check(conn, g.config, now=g.clock.now())
    result = provers.refresh(conn, g.config, run=detached.run)  # judged by its exit, not by who holds its output
    if as_json:
        print_json(result.view())
        return
    if result.provers:
        print_table(result.provers, ["label", "endpoint", "joined_at"])
    else:
        echo("no joined provers: no running machine's tunnel end answers")
    say(_file_line(result.upstream_file, len(result.provers), changed=result.changed, reloaded=result.reloaded))


def _file_line(upstream_file: str | None, count: int, *, changed: bool, reloaded: bool) -> str:
    """What became of nginx's upstream file, in words: written and reloaded, or left as it was."""
    if upstream_file is None:
        return "provers.upstream_file is not set: no upstream file is written"
    if not changed:
        return f"{upstream_file} unchanged: it already lists these {count} prover(s); nothing reloaded"
    return f"{upstream_file} rewritten: {count} prover(s)" + ("; reloaded" if reloaded else "; no reload_command set")
