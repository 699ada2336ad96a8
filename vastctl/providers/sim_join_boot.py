"""What a simulated machine's boot script says on its way to joining: its stage times and its pushed logs.

A real machine reports where its boot's time went with `running` (fleet --json: boot_stages) and pushes the
tails of its logs (`vastctl logs`) after the parameter fetch, after the bench and as it proves. A simulated
one runs no script, so the lines are written here from its BootPlan, at the simulated moments the engine
makes those reports, in the boot script's own words (vastctl/machine/templates/onstart.sh). The bench's time
splits as sim_market draws it: the daemon's start, SRS and PCE loading with the warm-up proof, the batch.
"""

from __future__ import annotations

from typing import Literal

from vastctl.errors import VastctlError
from vastctl.providers import sim_market as model
from vastctl.providers.reports_sink import Reports
from vastctl.providers.sim_store import Machine, moment

Upto = Literal["params", "bench", "running"]
DAEMON_S = 20.0  # of the bench's time: cuzk starts and its status API answers
LOADING_S = 15.0 + 47.0  # SRS load and PCE extraction, before the warm-up proof
JOIN_S = 2.0  # the engine's step from bench-report to running


def stages(plan: model.BootPlan) -> dict[str, float]:
    """The boot's stage seconds as onstart.sh reports them with `running` (lifecycle.BOOT_STAGES)."""
    proofs = max(0.0, plan.bench_s - DAEMON_S - LOADING_S)
    warmup = LOADING_S + proofs / (model.BENCH_PROOFS + 1)
    return {"fetch": float(plan.fetch_s), "daemon": DAEMON_S, "warmup": round(warmup, 1),
            "bench": round(max(0.0, plan.bench_s - DAEMON_S - warmup), 1), "join": JOIN_S}


def logs(machine: Machine, plan: model.BootPlan, host: model.Host, upto: Upto) -> dict[str, str]:
    """The logs the script pushes at that point (name → text): onstart and fetch after the fetch; onstart,
    cuzk and bench after the bench; onstart and cuzk once it proves."""
    start = machine.epoch_at + plan.provision_s + plan.pull_s  # the container runs: the script starts
    registered = start + plan.install_s
    fetched = registered + plan.fetch_s
    took = stages(plan)
    daemon_up = fetched + took["daemon"]
    benched = fetched + plan.bench_s

    def line(at: float, text: str) -> str:
        return f"{moment(at):%Y-%m-%dT%H:%M:%SZ} vastctl-onstart: {text}"  # date -u +%FT%TZ

    onstart = [line(registered, "fetching 32GiB parameters from the public gateway (fetch.log)"),
               line(fetched, f"stage fetch took {took['fetch']:.0f}s")]
    pushed = {"fetch": f"fetched {model.PARAMS_GIB:g} GiB of parameters at {host.inet_down_mbps:.0f} Mbit/s;"
                       " every file's digest checked\n"}
    if upto in ("bench", "running"):
        onstart += [line(daemon_up, "cuzk is up (cuzk.log); benchmarking (bench.log)"),
                    line(daemon_up, f"stage daemon took {took['daemon']:.0f}s"),
                    line(daemon_up + took["warmup"], f"stage warmup took {took['warmup']:.0f}s"),
                    line(benched, f"stage bench took {took['bench']:.0f}s")]
        ppm = plan.bench_rate / 60
        pushed = {"cuzk": f"cuzk daemon on {host.gpu_name} x{host.num_gpus}: gRPC on 127.0.0.1:9820, status on"
                          " 127.0.0.1:9821; SRS loaded\n",
                  "bench": f"status: COMPLETED\nproofs: {model.BENCH_PROOFS}\nthroughput: {ppm:.3f} proofs/min\n"}
    if upto == "running":
        onstart.append(line(benched + JOIN_S, f"stage join took {JOIN_S:.0f}s"))
        pushed = {"cuzk": pushed["cuzk"] + f"proving since {moment(benched + JOIN_S):%Y-%m-%dT%H:%M:%SZ}\n"}
    return {"onstart": "\n".join(onstart) + "\n", **pushed}


def push(reports: Reports, machine: Machine, plan: model.BootPlan, host: model.Host, upto: Upto) -> None:
    """Push those logs as the script's `push` does: never fatal (a refused push changes nothing)."""
    if not machine.uuid:
        return
    for name, text in logs(machine, plan, host, upto).items():
        try:
            reports.log_push(machine.uuid, name, text)
        except VastctlError:
            pass

