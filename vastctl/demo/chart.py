"""`vastctl demo --chart FILE`: the day on one page, as SVG or PNG (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path

from vastctl.demo.day import DemoResult
from vastctl.demo.setting import OUTAGE
from vastctl.errors import BadInput

CHART_COLOURS = {  # the dashboard's chart draws target, capacity, queue and spend in these (dashboard.css)
    "arrival": "#bbbbbb", "target": "#d62728", "capacity": "#1f77b4", "proving": "#2ca02c", "queue": "#9467bd",
    "spend": "#8c564b", "outage": "#ffdd99", "launch": "#444444",
}
KILL_COLOURS = ("#e377c2", "#ff7f0e", "#17becf", "#bcbd22", "#7f7f7f", "#9edae5", "#c49c94", "#98df8a", "#aec7e8",
                "#ffbb78")


def write_chart(result: DemoResult, path: Path) -> None:
    """The run on one page, as SVG or PNG by the file's extension (matplotlib): work arriving, target and capacity
    with launches, kills (by reason) and the demand outage marked; the queue; spend per hour and cumulative;
    how long proofs waited."""
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise BadInput(f"--chart {path}: the file must end in .svg or .png")
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "vastctl-demo"  # the same run writes the same SVG
    from matplotlib import pyplot

    colour = CHART_COLOURS
    samples = result.samples
    hours = [sample.minute / 60 for sample in samples]
    end = hours[-1] if hours else 0.0
    figure = pyplot.figure(figsize=(11, 10.5))
    grid = figure.add_gridspec(4, 1, height_ratios=[3, 1.2, 1.3, 1.5], hspace=0.35)
    rates = figure.add_subplot(grid[0])
    queue = figure.add_subplot(grid[1], sharex=rates)
    spend = figure.add_subplot(grid[2], sharex=rates)
    waits_axis = figure.add_subplot(grid[3])

    rates.plot(hours, [s.arrival for s in samples], color=colour["arrival"], linewidth=0.8, label="work arriving")
    rates.plot(hours, [s.target for s in samples], color=colour["target"], linewidth=1.6, label="target")
    rates.plot(hours, [s.believed for s in samples], color=colour["capacity"], linewidth=0.9, linestyle="--",
               label="capacity vastctl counts")
    rates.plot(hours, [s.capacity for s in samples], color=colour["proving"], linewidth=1.4,
               label="capacity proving (simulator)")
    top = max([s.arrival for s in samples] + [s.target for s in samples] + [s.capacity for s in samples] + [1.0])
    launched = [minute / 60 for minute in result.launches if minute / 60 <= end]
    if launched:
        rates.plot(launched, [LAUNCH_ROW * top] * len(launched), linestyle="none", marker="^", markersize=5,
                   color=colour["launch"], label=f"launch ({len(launched)})")
    by_reason: dict[str, list[float]] = {}
    for minute, code in result.kills:
        if minute / 60 <= end:
            by_reason.setdefault(code, []).append(minute / 60)
    for index, (code, moments) in enumerate(sorted(by_reason.items())):
        rates.plot(moments, [KILL_ROW * top] * len(moments), linestyle="none", marker="v", markersize=6,
                   color=KILL_COLOURS[index % len(KILL_COLOURS)], label=f"kill: {code} ({len(moments)})")
    rates.set_ylim((KILL_ROW - 0.05) * top, top * 1.08)
    rates.set_ylabel("proofs / hour")
    figures = result.figures
    rates.set_title(f"vastctl demo: seed {figures['seed']}, policy {figures['policy']}, failures {figures['failures']}"
                    f" — target met {_pct(figures['target_attainment'])}, ${figures['cost']:.2f},"
                    f" {figures['proofs']} proofs", fontsize=10)

    queue.plot(hours, [s.queued for s in samples], color=colour["queue"], linewidth=1.0)
    queue.set_ylabel("queued")
    spend.plot(hours, [s.spend_per_hour for s in samples], color=colour["spend"], linewidth=1.0, label="$/hour")
    spend.set_ylabel("spend $/h")
    spent = spend.twinx()
    total, cumulative = 0.0, []
    for sample in samples:
        total += sample.spend_per_hour / 60
        cumulative.append(total)
    spent.plot(hours, cumulative, color=colour["spend"], linewidth=1.2, linestyle=":", label="$ so far")
    spent.set_ylabel("$ so far")
    spend.legend(handles=spend.get_lines() + spent.get_lines(), loc="upper left", fontsize=8)
    spend.set_xlabel("simulated hours")

    outage_labelled = False
    for axis in (rates, queue, spend):
        axis.grid(True, linewidth=0.3)
        for day in range(int(end // 24) + 1 if hours else 0):
            if day * 24 + OUTAGE[0] <= end:
                label = None if outage_labelled or axis is not rates else "demand source down (nothing reported)"
                axis.axvspan(day * 24 + OUTAGE[0], min(end, day * 24 + OUTAGE[1]), color=colour["outage"], alpha=0.4,
                             linewidth=0, label=label)
                outage_labelled = outage_labelled or label is not None
    rates.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)

    if result.waits:  # each call's wait as the day's proof_calls rows hold it: the summary's figures, drawn
        figures = result.figures
        top_wait = max(1.0, (figures["proof_wait_p99_s"] or 60.0) / 60)
        waits_axis.hist([min(float(wait), top_wait) for wait in result.waits], weights=list(result.waits.values()),
                        bins=40, color=colour["queue"], alpha=0.8)
        for name, style in (("p50", "-"), ("p95", "--")):
            value = figures[f"proof_wait_{name}_s"]
            if value is None:
                continue
            waits_axis.axvline(value / 60, color="#333333", linewidth=1.0, linestyle=style,
                               label=f"{name} {value / 60:.0f} min")
        waits_axis.set_yscale("log")  # most proofs wait their proving time alone: the tail would not show on a linear axis
        waits_axis.legend(loc="upper right", fontsize=8)
    waits_axis.set_xlabel("minutes a proof waited, arrival to its answer: held, then proving (first in, first out;"
                          " the top 1% at the right)")
    waits_axis.set_ylabel("proofs")
    waits_axis.grid(True, linewidth=0.3)
    metadata = {"Date": None} if suffix == ".svg" else {"Software": None}
    figure.savefig(path, format=suffix[1:], metadata=metadata, bbox_inches="tight")
    pyplot.close(figure)


LAUNCH_ROW, KILL_ROW = -0.04, -0.13  # the markers' rows under the rates, as shares of its top: apart, not overlapping


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"
