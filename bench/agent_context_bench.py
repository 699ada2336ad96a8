"""Input tokens per agent-step (policy llm) at 10, 200 and 1,000 machines and after 1,000 steps of history,
and what the default model costs a day at one step every 5 minutes.

Each case runs the real `llm.run` with the real Anthropic SDK against the local
fake Messages API (tests/helpers/fake_anthropic.py) and measures the request bodies
that actually went out: system prompt, tools and messages, tokens estimated as
memory.estimate_tokens does (characters ÷ 3, high for JSON). The observation
dicts are built here in the shape agent-step hands to llm.run
(observe.Observation.to_prompt — fleet.instance_view rows plus expected_rate,
demand, settings, events): every tenth machine launching, every tenth fetching
parameters, the rest running. History is written as agent-step and llm.run
write it: an `agent_steps` row, the four messages of a two-round step, and a note
every tenth step.

Every case scripts the same typical step: round 1 the model calls `launch`
and `note`, round 2 it ends its turn. Output tokens are not measured (the fake
answers are tiny): the cost assumes OUTPUT_TOKENS_PER_ROUND.

Rerun:
    python bench/agent_context_bench.py
    python bench/agent_context_bench.py --interval-min 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.fake_anthropic import FakeMessagesAPI, fleet_observation, message, text, tool_use

from vastctl import clock as clock_module
from vastctl.agent import llm, memory
from vastctl.clock import VirtualClock
from vastctl.config import from_mapping
from vastctl.state import db

OUTPUT_TOKENS_PER_ROUND = 150  # a sentence and a tool call or two
START = datetime(2026, 5, 1, tzinfo=timezone.utc)
CASES = [(10, 0), (200, 0), (1000, 0), (10, 1000), (1000, 1000)]  # (machines, steps of history)


def write_history(conn, steps: int, machines: int) -> None:
    """`steps` past steps of a `machines`-machine fleet, as agent-step and llm.run record them."""
    stored = json.dumps(fleet_observation(machines, events=5))
    with db.transaction(conn):
        for step_id in range(1, steps + 1):
            at = START + timedelta(minutes=5 * step_id)
            iso = clock_module.to_iso(at)
            actions = [{"action": {"kind": "launch", "count": 1, "gpu_name": "RTX 4090"}, "ok": True,
                        "result": f"launched vastctl-{step_id:05d}"}]
            conn.execute(
                "INSERT INTO agent_steps (id, started_at, finished_at, policy, outcome, event_cursor, observation,"
                " actions, refused, errors, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost)"
                " VALUES (?, ?, ?, 'llm', 'ok', ?, ?, ?, '[]', '[]', 6000, 300, 0, 0, 0.0008)",
                (step_id, iso, iso, step_id * 3, stored, json.dumps(actions)))
            for role, content in (
                ("user", [{"type": "text", "text": "(the opening message)" * 400}]),
                ("assistant", [tool_use("launch", {"count": 1}, f"t{step_id}")]),
                ("user", [{"type": "tool_result", "tool_use_id": f"t{step_id}", "is_error": False,
                           "content": f"launched vastctl-{step_id:05d}"}]),
                ("assistant", [text(f"Launched one RTX 4090: capacity short of target at step {step_id}.")]),
            ):
                conn.execute("INSERT INTO agent_messages (step_id, at, role, content) VALUES (?, ?, ?, ?)",
                             (step_id, iso, role, json.dumps(content)))
            if step_id % 10 == 0:
                conn.execute("INSERT INTO agent_notes (step_id, at, text) VALUES (?, ?, ?)",
                             (step_id, iso, f"step {step_id}: RTX 5090 offers above $0.60/h since 14:00; prefer 4090s"))


def run_case(api: FakeMessagesAPI, machines: int, history: int, config) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        conn = db.connect(Path(tmp) / "bench.db", create=True, now=clock_module.SYSTEM.now())
        write_history(conn, history, machines)
        observation = fleet_observation(machines, events=min(machines, 200))
        suggestion = [{"kind": "launch", "count": 2, "gpu_name": "RTX 4090", "reason": "capacity below target"}]
        started = time.perf_counter()
        prompt = memory.build_prompt(conn, observation=observation, suggestion=suggestion, step_id=history + 1,
                                     budget_tokens=llm.opening_budget(config))
        build_ms = (time.perf_counter() - started) * 1000
        first = len(api.requests)
        api.answer(message(tool_use("launch", {"count": 2, "gpu_name": "RTX 4090"}),
                           tool_use("note", {"text": "launched 2 for the queue"})),
                   message(text("Launched two RTX 4090s for the queue.")))
        execute = lambda name, tool_input: llm.ToolOutcome(True, f"{name} done: vastctl-a, vastctl-b")  # noqa: E731
        env = {"ANTHROPIC_API_KEY": "bench-key", "ANTHROPIC_BASE_URL": api.url}
        result = llm.run(conn, config, observation=observation, suggestion=suggestion, execute=execute,
                         clock=VirtualClock(START), step_id=history + 1, env=env)
        conn.close()
    assert result.stop_reason == "end_turn", result
    per_request = [memory.estimate_tokens(memory.as_data(request["body"]["system"])
                                          + memory.as_data(request["body"]["tools"])
                                          + memory.as_data(request["body"]["messages"]))
                   for request in api.requests[first:]]
    return {"machines": machines, "history": history, "requests": per_request, "omitted": prompt.omitted,
            "build_ms": build_ms}


def cost_per_day(input_tokens: int, rounds: int, prefix: int, prices: list[float], steps_per_day: float,
                 cached: bool) -> float:
    """$ a day; with `cached`, every request reads the static prefix from the cache instead of paying it in full."""
    tokens = {"input": input_tokens - (prefix * rounds if cached else 0), "output": OUTPUT_TOKENS_PER_ROUND * rounds,
              "cache_read": prefix * rounds if cached else 0, "cache_write": 0}
    return llm.cost_of(tokens, prices) * steps_per_day


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval-min", type=float, default=5.0, help="minutes between steps for the cost")
    args = parser.parse_args()
    config = from_mapping({})
    prices = llm.price_of(config)
    prefix = llm.prefix_tokens()
    steps_per_day = 24 * 60 / args.interval_min
    api = FakeMessagesAPI()
    try:
        rows = [run_case(api, machines, history, config) for machines, history in CASES]
    finally:
        api.close()

    print(f"python bench/agent_context_bench.py --interval-min {args.interval_min:g}\n")
    print(f"model {config.agent.model}, prices {prices} $/M tokens (input, output, cache read, cache write); "
          f"agent.max_context_tokens {config.agent.max_context_tokens}; static prefix {prefix} tokens; "
          f"{steps_per_day:g} steps a day\n")
    print("| machines | history steps | round 1 input tokens | round 2 input tokens | left out to fit | "
          "prompt build ms | $/day uncached | $/day prefix cached |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        total = sum(row["requests"])
        omitted = ", ".join(f"{count} {what}" for what, count in row["omitted"].items()) or "nothing"
        uncached = cost_per_day(total, len(row["requests"]), prefix, prices, steps_per_day, cached=False)
        cached = cost_per_day(total, len(row["requests"]), prefix, prices, steps_per_day, cached=True)
        print(f"| {row['machines']:,} | {row['history']:,} | {row['requests'][0]:,} | {row['requests'][1]:,} | "
              f"{omitted} | {row['build_ms']:.0f} | {uncached:.3f} | {cached:.3f} |")
    print(f"\nEvery request ≤ {config.agent.max_context_tokens} tokens: "
          f"{all(t <= config.agent.max_context_tokens for row in rows for t in row['requests'])}")


if __name__ == "__main__":
    main()
