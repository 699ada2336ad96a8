"""The control loop over simulated days: the rules policy beside a static fleet and the lower bound.

`--fleets rules plan` adds the planning policy (agent.policy plan, vastctl/agent/plan.py) on the rules' fleet,
reported in the same columns (bench/README.md "The planning policy"), and beside its cost the error of its own
forecast (bench/forecast_error.py): each hour of the plan's day, the proofs vastctl/agent/plan_forecast.py
forecast for the next hour and for the hour after (60-120 min ahead, past the look-ahead: the profile) against
the proofs that came in it. Per seed: the mean |forecast − arrived| per hour (proofs, and % of the hours'
arrivals), the bias over the day (Σ forecast − arrived, % of arrived), the worst hour (signed, and the hour of
the run it covers); for the next hour also the error of the part the source times exactly (its arrival
buckets within demand.lookahead_window, over the hours the demand was known). The summary shows the mean
|err|/h over the seeds ("abs err" in the headers, whose tables are Markdown). The demand reports, hence the
forecast, are the same whatever the fleet does, so it is measured on the plan's day only (one observe a
simulated hour).

For each seed and each failure level (low, default, high), one `vastctl demo`
day (vastctl/demo/: the same demand curve, market and cron cadence) with
the rules policy, and one with a static fleet (the target set once to the
day's peak, never scaled down: what an operator without agent-step would
run), beside the lower bound: the least any fleet could pay for the day's
proofs on that market (demo/figures.least_costs, vastctl/bound.py's linear program:
the hosts the fleet may rent, kept through hours others take, at the price
they were rented at, proofs waiting up to agent.max_wait; bench/README.md
"The lower bound" has its assumptions). Reported per failure level, over the
seeds: the service (the share of proofs done within agent.max_wait of
arriving, mean and worst seed; wait p50/p95: held + proving time of each
proof's call, as the proof router records it and `fleet --json` reads it), target attainment after
warm-up, cost per 1,000 proofs as a ratio to the lower bound (mean ± its standard error over the seeds, and the
worst seed; and to the any-host bound, no filter of the fleet's, and to the bid-aware bound, every
host at its min_bid), detection latency from a machine dying (the market's
died_at) to its kill event (p50/p95 over every death of every seed), and
leaked instance-hours (billed after the kill) against billed ones.

Targets for the rules policy (on-demand rental), against the true bound: at
the default level ≥ 99% of proofs within 45 min with cost ≤ 1.35× the lower
bound (mean over the seeds); at the high level ≥ 95% within 45 min; leaked <
1% of billed, p95 detection ≤ 180 s. With `--set launch.rental=mixed` (three
quarters of the fleet bidding, `launch.interruptible_share`), cost ≤ 1.25× the
bid-aware bound (mean); "bids / outbids / rebids" counts the machines rented
interruptible, the times a rival bid paused one, and the bids raised.

Rerun:
    python bench/control_loop.py                       # seeds 1 2 3 9, 24 h, every level (~3 min)
    python bench/control_loop.py --seeds 4 5 6 7 --fleets rules   # seeds the defaults were not tuned on
    python bench/control_loop.py --seeds 1 2 3 4 5 --levels default
    python bench/control_loop.py --set agent.headroom=0.1 --set fleet.min_inet_down_mbps=1000
    python bench/control_loop.py --fleets rules --set launch.rental=mixed
    python bench/control_loop.py --seeds 1 2 3 --levels default --fleets rules plan   # the planning policy
    python bench/control_loop.py --seeds 11 12 13 14 15 16 --levels default --fleets plan   # and its forecast's error
    python bench/cost_ledger.py                        # where the rules fleet's money goes above the bound
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from forecast_error import DayErrors, Errors, ForecastLog

from vastctl.config import Config, from_mapping
from vastctl.demo import day, figures, setting


def overrides(pairs: list[str]):
    """`section.key=value` pairs → a function that applies them to the demo's config (values as YAML reads them)."""
    import yaml

    tree: dict = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        section, _, name = key.partition(".")
        tree.setdefault(section, {})[name] = yaml.safe_load(value)
    parsed = from_mapping(tree)  # validated like a config file

    def apply(config: Config) -> None:
        for section, values in tree.items():
            for name in values:
                setattr(getattr(config, section), name, getattr(getattr(parsed, section), name))

    return apply


FLEETS = (*setting.FLEETS, "plan")  # plan: the rules' fleet run by the planning policy (agent/plan.py)


def one_day(seed: int, level: str, fleet: str, hours: float, configure) -> dict:
    """One simulated day's figures; the plan's also its forecast's error (bench/forecast_error.py: the demand
    reports, hence the forecast, are the same whatever the fleet does, so it is measured on the plan's day only)."""
    with tempfile.TemporaryDirectory(prefix="vastctl-bench-") as scratch:
        policy = "plan" if fleet == "plan" else "rules"
        options = setting.DemoOptions(hours=hours, seed=seed, failures=level, fleet="rules" if fleet == "plan" else fleet,
                                      policy=policy)
        if fleet != "plan":
            result = day.run(options, Path(scratch), configure=configure)
            return {**result.figures, "latencies": result.latencies, "forecast": None}
        log = ForecastLog()
        result = day.run(options, Path(scratch), configure=log.configure(configure), progress=log.minute)
        errors = log.finish([sample.arrival for sample in result.samples])
        return {**result.figures, "latencies": result.latencies, "forecast": errors}


FORECAST_SUMMARY = "forecast abs err/h: next hour / 60–120 min"
# no `|` in a header: the tables are Markdown's
FORECAST_COLUMNS = ("forecast abs err/h (next hour)", "bias / worst (next hour)", "its timed part: abs err/h, hours",
                    "forecast abs err/h (60–120 min)", "bias / worst (60–120 min)")


def forecast_columns(errors: DayErrors | None) -> dict[str, str]:
    """The per-seed columns of the plan's forecast error (bench/forecast_error.py), "-" for the other fleets."""
    if errors is None:
        return dict.fromkeys(FORECAST_COLUMNS, "-")

    def cells(part: Errors | None) -> list[str]:
        return [part.mean(), part.bias_and_worst()] if part is not None else ["-", "-"]

    timed = f"{errors.timed.mean()}, {errors.timed.hours} h" if errors.timed is not None else "-"
    return dict(zip(FORECAST_COLUMNS, [*cells(errors.next_hour), timed, *cells(errors.after)]))


def forecast_mean(runs: list[dict]) -> str:
    """The summary's cell: the mean over the days of |err|/h (and its %), next hour / 60–120 min."""
    cells = []
    for name in ("next_hour", "after"):
        parts = [getattr(r["forecast"], name) for r in runs if r.get("forecast") is not None]
        parts = [part for part in parts if part is not None]
        pcts = [part.mean_abs_pct for part in parts if part.mean_abs_pct is not None]
        if not parts:
            cells.append("-")
            continue
        pct = f" ({sum(pcts) / len(pcts):.1f}%)" if pcts else ""
        cells.append(f"{sum(p.mean_abs for p in parts) / len(parts):.1f}{pct}")
    return " / ".join(cells)


def summarise(runs: list[dict], fleet: str) -> dict:
    attain = [r["target_attainment"] for r in runs if r["target_attainment"] is not None]
    ratios = [r["cost_ratio_to_lower_bound"] for r in runs if r["cost_ratio_to_lower_bound"] is not None]
    latencies = [x for r in runs for x in r["latencies"]]
    billed = sum(r["billed_instance_hours"] for r in runs)
    leaked = sum(r["leaked_instance_hours"] for r in runs)
    within = [r["proofs_within_max_wait"] for r in runs if r["proofs_within_max_wait"] is not None]
    p50 = [r["proof_wait_p50_s"] for r in runs if r["proof_wait_p50_s"] is not None]
    p95 = [r["proof_wait_p95_s"] for r in runs if r["proof_wait_p95_s"] is not None]
    limit = runs[0]["max_wait_s"] / 60 if runs else 45
    return {
        "fleet": fleet,
        f"done ≤ {limit:g} min": (f"{sum(within) / len(within) * 100:.2f}% (worst {min(within) * 100:.2f}%)"
                                  if within else "-"),
        "wait p50 / p95 min": (f"{sum(p50) / len(p50) / 60:.0f} / {sum(p95) / len(p95) / 60:.0f}"
                               f" (worst p95 {max(p95) / 60:.0f})" if p95 else "-"),
        "attainment": f"{sum(attain) / len(attain) * 100:.1f}% (worst {min(attain) * 100:.1f}%)" if attain else "-",
        "cost/1000 proofs": f"${sum(r['cost_per_1000_proofs'] for r in runs) / len(runs):.2f}",
        "× lower bound": f"{sum(ratios) / len(ratios):.2f}{_spread(ratios)} (worst {max(ratios):.2f})" if ratios else "-",
        "× any host / × bid-aware": " / ".join(_mean_worst([r[key] for r in runs if r.get(key) is not None])
                                               for key in ("cost_ratio_to_any_host_bound",
                                                           "cost_ratio_to_interruptible_bound")),
        "detect p50/p95": (f"{figures.percentile(latencies, 0.5):.0f}s / {figures.percentile(latencies, 0.95):.0f}s"
                           f" (n={len(latencies)})") if latencies else "-",
        "leaked h (of billed)": f"{leaked:.2f} of {billed:.0f} ({leaked / billed * 100:.2f}%)" if billed else "-",
        "bids / outbids / rebids": (f"{sum(r.get('machines_interruptible', 0) for r in runs)}"
                                    f" / {sum(r.get('outbids', 0) for r in runs)}"
                                    f" / {sum(r.get('rebids', 0) for r in runs)}"),
    }


def _spread(values: list[float]) -> str:
    """The standard error of the mean over the seeds: one day's cost moves with which host comes up when and which
    fault its boot draws, so a mean over a dozen days is known to about this much."""
    return f" ± {statistics.stdev(values) / len(values) ** 0.5:.2f}" if len(values) > 1 else ""


def _mean_worst(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f} ({max(values):.2f})" if values else "-"


def lower_bound_rows(runs: list[dict]) -> list[dict]:
    exact = sum(r["lower_bound_cost_per_1000_proofs"] for r in runs) / len(runs)
    whole = sum(r["lower_bound_whole_machines_cost_per_1000_proofs"] for r in runs) / len(runs)
    sized = sum(r["lower_bound_target_sized_cost_per_1000_proofs"] for r in runs) / len(runs)
    bids = sum(r["lower_bound_interruptible_cost_per_1000_proofs"] for r in runs) / len(runs)
    any_host = sum(r["lower_bound_any_host_cost_per_1000_proofs"] for r in runs) / len(runs)
    minutes = sum(r["lower_bound_minute_by_minute_cost_per_1000_proofs"] for r in runs) / len(runs)
    blank = {"attainment": "100%", "detect p50/p95": "-", "leaked h (of billed)": "0", "bids / outbids / rebids": "-",
             "× any host / × bid-aware": "-"}
    limit = runs[0]["max_wait_s"] / 60 if runs else 45
    blank = {f"done ≤ {limit:g} min": "-", "wait p50 / p95 min": "-", **blank}
    return [{"fleet": "lower bound", **blank, "cost/1000 proofs": f"${exact:.2f}", "× lower bound": "1.00"},
            {"fleet": "bound, whole machines", **blank, "cost/1000 proofs": f"${whole:.2f}",
             "× lower bound": f"{whole / exact:.2f}"},
            {"fleet": "bound, whole, sized to target×(1+headroom)", **blank, "attainment": "-",
             "cost/1000 proofs": f"${sized:.2f}", "× lower bound": f"{sized / exact:.2f}"},
            {"fleet": "bid-aware bound (the market's rivals)", **blank,
             "cost/1000 proofs": f"${bids:.2f}", "× lower bound": f"{bids / exact:.2f}"},
            {"fleet": "bound on any host (no filter of the fleet's)", **blank,
             "cost/1000 proofs": f"${any_host:.2f}", "× lower bound": f"{any_host / exact:.2f}"},
            {"fleet": "minute by minute (the old figure: not a bound)", **blank,
             "cost/1000 proofs": f"${minutes:.2f}", "× lower bound": f"{minutes / exact:.2f}"}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 9])
    parser.add_argument("--levels", nargs="+", default=list(setting.FAILURE_LEVELS), choices=setting.FAILURE_LEVELS)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--fleets", nargs="+", default=list(setting.FLEETS), choices=FLEETS)
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        help="a config override for every run, e.g. agent.headroom=0.1")
    args = parser.parse_args(argv)
    from tabulate import tabulate

    configure = overrides(args.settings) if args.settings else None
    started = time.perf_counter()
    rows = []
    seeds = []
    with_forecast = "plan" in args.fleets
    for level in args.levels:
        by_fleet = {fleet: [one_day(seed, level, fleet, args.hours, configure) for seed in args.seeds]
                    for fleet in args.fleets}
        seeds += [{"failures": level, "fleet": fleet, "seed": r["seed"],
                   "done ≤ max_wait": f"{r['proofs_within_max_wait'] * 100:.2f}%",
                   "cost/1000 proofs": f"${r['cost_per_1000_proofs']:.2f}",
                   "× lower bound": r["cost_ratio_to_lower_bound"], "× any host": r["cost_ratio_to_any_host_bound"],
                   "× bid-aware": r["cost_ratio_to_interruptible_bound"],
                   **(forecast_columns(r["forecast"]) if with_forecast else {})}
                  for fleet, runs in by_fleet.items() for r in runs]
        for fleet, runs in by_fleet.items():
            rows.append({"failures": level, **summarise(runs, fleet),
                         **({FORECAST_SUMMARY: forecast_mean(runs) if fleet == "plan" else "-"} if with_forecast else {})})
            if fleet == "rules":
                faults = {kind for r in runs for kind, n in r["faults"].items() if n}
                missing = sorted(set(runs[0]["faults"]) - faults)
                if missing:
                    print(f"{level}: fault kinds that never happened: {', '.join(missing)}", file=sys.stderr)
        rows.extend({"failures": level, **row, **({FORECAST_SUMMARY: "-"} if with_forecast else {})}
                    for row in lower_bound_rows(next(iter(by_fleet.values()))))
    print(f"control loop: {args.hours:g} simulated hours, seeds {' '.join(map(str, args.seeds))}"
          + (f", with {' '.join(args.settings)}" if args.settings else ""))
    print(tabulate(rows, headers="keys", tablefmt="github"))
    print("\nper seed:")
    print(tabulate(seeds, headers="keys", tablefmt="github"))
    print(f"\n{len(args.levels) * len(args.seeds) * len(args.fleets)} simulated days in"
          f" {time.perf_counter() - started:.0f} s. Rerun: python bench/control_loop.py"
          + "".join(f" {shlex.quote(arg)}" for arg in (sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
