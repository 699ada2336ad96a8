"""Mutation testing of the pure decision modules: each small change mutmut makes to them should fail a quick test.

    pip install -e '.[test,mutation]'
    python bench/mutation.py            # a fresh run (mutants/ removed first), then the score per module
    python bench/mutation.py --report   # the score of the last run, nothing run
    python bench/mutation.py --survivors  # again only the mutants that survived the last run (after new tests)
    python bench/mutation.py 'vastctl.bids.*'   # only the mutants whose names match (mutmut's own patterns)

The modules and the tests run against them are [tool.mutmut] in pyproject.toml; what was measured and why each
surviving mutant is left: bench/README.md, "Mutation testing". One worker (`--max-children 1`), pytest in the
worker's process (`-n 0`): the machine's cores are shared.

A mutant is killed when a test fails on it, or when its tests run past the timeout (a loop or a wait the change
made endless); it survives when the tests pass, and a mutant that no selected test reaches counts as surviving
too. Score = killed / (killed + survived + no tests).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# every mutant of these modules (all of each module is decisions from data)
WHOLE = ["vastctl.reconcile.decide", "vastctl.validate", "vastctl.agent.sizing", "vastctl.agent.valuation",
         "vastctl.agent.outbid", "vastctl.bids", "vastctl.route.dispatch"]
# rates.py: its pure functions only (bench_report, heartbeat and the helpers that query the state file are not)
RATES_PURE = ["validate_rate", "rate_ceiling", "measured_rate_bound", "bounded", "validate_proofs",
              "counted_increment", "_smoothed_rate", "_bound_source"]
PATTERNS = [f"{module}.*" for module in WHOLE] + [f"vastctl.state.rates.x_{name}__mutmut_*" for name in RATES_PURE]

# mutmut's exit codes as it records them in mutants/**/*.meta (mutmut/stats.py)
KILLED = {1, 3, 36, 24, -24, 152, 255}  # a test failed, or the run passed its timeout
SURVIVED = {0}
NO_TESTS = {5, 33}


def selected(name: str, patterns: list[str]) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, pattern) for pattern in patterns)


def results(patterns: list[str]) -> tuple[dict[str, Counter[str]], list[str]]:
    """module → counts of killed / survived / no tests / not run, from the meta files of the last run, and the
    names of the mutants that survived or that no test reached."""
    by_module: dict[str, Counter[str]] = {}
    survivors: list[str] = []
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        module = ".".join(meta.relative_to(ROOT / "mutants").with_suffix("").with_suffix("").parts)
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if not selected(name, patterns):
                continue
            kind = ("killed" if code in KILLED else "survived" if code in SURVIVED else "no tests" if code in NO_TESTS
                    else "not run" if code is None else f"other ({code})")
            by_module.setdefault(module, Counter())[kind] += 1
            if kind in ("survived", "no tests"):
                survivors.append(f"{name} ({kind})")
    return by_module, survivors


def report(patterns: list[str]) -> int:
    by_module, survivors = results(patterns)
    if not by_module:
        print("no results: run `python bench/mutation.py` first", file=sys.stderr)
        return 1
    print("| module | mutants | killed | survived | no tests | score |\n|---|---|---|---|---|---|")
    total: Counter[str] = Counter()
    for module, counts in by_module.items():
        total.update(counts)
        print(row(module, counts))
    print(row("**all**", total))
    print("\nsurviving (see `mutmut show NAME`):")
    for name in survivors:
        print(f"  {name}")
    print(f"\nrerun: python bench/mutation.py  (mutmut {mutmut_version()}, one worker, quick tests of"
          " [tool.mutmut] pytest_add_cli_args_test_selection)")
    return 0


def row(module: str, counts: Counter[str]) -> str:
    killed, survived, untested = counts["killed"], counts["survived"], counts["no tests"]
    scored = killed + survived + untested
    score = f"{100 * killed / scored:.1f}%" if scored else "–"
    extra = "".join(f" ({n} {kind})" for kind, n in counts.items() if kind not in ("killed", "survived", "no tests"))
    return f"| {module} | {sum(counts.values())} | {killed} | {survived} | {untested} | {score}{extra} |"


def mutmut_command() -> str:
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")
    if mutmut is None:
        sys.exit("error: mutmut is not installed: pip install -e '.[test,mutation]'")
    return mutmut


def mutmut_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mutmut")
    except PackageNotFoundError:
        return "(not installed: pip install -e '.[mutation]')"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", nargs="*", help="only the mutants whose names match these (default: all)")
    parser.add_argument("--report", action="store_true", help="print the last run's score, run nothing")
    parser.add_argument("--survivors", action="store_true", help="rerun only the last run's surviving mutants")
    args = parser.parse_args()
    patterns = args.patterns or PATTERNS
    if args.survivors:
        names = [name.split(" ")[0] for name in results(patterns)[1]]
        if not names:
            return report(patterns)
        subprocess.run([mutmut_command(), "run", "--max-children", "1", *names], cwd=ROOT, check=False)
        return report(patterns)
    if not args.report:
        mutmut = mutmut_command()
        if not args.patterns:
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # a whole run starts from nothing
        command = [mutmut, "run", "--max-children", "1", *patterns]
        print("$", " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=False)
    return report(patterns)


if __name__ == "__main__":
    sys.exit(main())
