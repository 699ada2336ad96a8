"""memory: what the llm policy keeps of its past, and the bounded message it is sent each step.

The record is complete: every message sent and every reply, as JSON, in
`agent_messages` (with the step it belongs to), and the notes the model left
itself with the `note` tool in `agent_notes`. What is *sent* is not the record
replayed: each step starts a fresh conversation from

    the static prefix      system prompt and tools (llm.py; cached by the API)
    notes                  the model's own notes, newest kept
    recent steps           one condensed line per step: what it saw, did, what came of it
    plan_suggestion        what the planning policy would do this step, applied to nothing
                           (agent/plan_suggestion.py)
    observation            this step's fleet, demand, events and last actions

so the input stays under `agent.max_context_tokens` however long the history
grows. Tokens are estimated locally (CHARS_PER_TOKEN, conservative for JSON).
When the budget is short, the oldest recent steps and notes go first, then the
observation is compacted: machines become a table (healthy running machines
dropped first, with counts of what was dropped), and only the newest events
and last actions are kept; past that every text is cut short and every list
emptied, so everything in the message is bounded, however many machines,
events or refused calls came before (a recent step shows ITEMS_PER_STEP of
each kind, with a count of the rest).

Everything dynamic — labels, vast status messages, kill reasons, even the
model's own notes — is sent as JSON inside one data block (DATA_OPEN …
DATA_CLOSE). `<` and `>` are escaped inside it, so no text from a machine can
close the block and speak as an instruction; the system prompt says what the
block is.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Sequence

from vastctl import clock
from vastctl.observe import expected_rate, stored_json
from vastctl.state.db import inserted_id, transaction

CHARS_PER_TOKEN = 3  # JSON with short keys and numbers tokenises at ~3–4 chars a token: estimate high
MAX_TEXT_CHARS = 240  # any one string from the fleet (status message, reason, note) is clipped to this
NOTE_MAX_CHARS = 1000
NOTES_SHOWN = 20
RECENT_STEPS_SHOWN = 12
SUGGESTION_SHOWN = 20
SUGGESTION_TEXT_CHARS = 600  # a plan's reason: its figures, then the action's own
EVENTS_WHEN_SHORT = 30  # events kept first when the observation must shrink (the newest)
LAST_ACTIONS_WHEN_SHORT = 20  # the previous step's actions kept first when the observation must shrink (the newest)
ITEMS_PER_STEP = 8  # actions, refusals, errors or calls shown per recent step; the rest counted
SHORT_TEXT_CHARS = 60  # every string, when even the compacted observation is over the budget
DATA_OPEN = "<fleet-data>"
DATA_CLOSE = "</fleet-data>"
CLOSING = (
    "Decide this step: call tools for the actions you take (none is a valid choice), "
    "then end with one short sentence saying why."
)


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def as_data(value: Any) -> str:
    """Compact JSON in which `<` and `>` are escaped, so no string inside can close a data block."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e")


def clip(value: Any, limit: int = MAX_TEXT_CHARS) -> Any:
    """The same structure with every string cut to `limit` characters (saying how much was cut)."""
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[:limit]}…(+{len(value) - limit} chars)"
    if isinstance(value, dict):
        return {key: clip(item, limit) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clip(item, limit) for item in value]
    return value


# --- the record ------------------------------------------------------------------------------------------


def record_message(conn: sqlite3.Connection, *, step_id: int | None, role: str, content: Any,
                   now: datetime) -> int:
    """One message of the conversation as sent or received (`role` user | assistant | error)."""
    with transaction(conn):
        return inserted_id(conn.execute(
            "INSERT INTO agent_messages (step_id, at, role, content) VALUES (?, ?, ?, ?)",
            (step_id, clock.to_iso(now), role, json.dumps(content, ensure_ascii=False, default=str)),
        ))


def add_note(conn: sqlite3.Connection, *, step_id: int | None, text: str, now: datetime) -> int:
    with transaction(conn):
        return inserted_id(conn.execute(
            "INSERT INTO agent_notes (step_id, at, text) VALUES (?, ?, ?)", (step_id, clock.to_iso(now), text),
        ))


def notes(conn: sqlite3.Connection, *, limit: int = NOTES_SHOWN) -> list[dict[str, Any]]:
    """The newest notes, oldest first."""
    rows = conn.execute("SELECT id, step_id, at, text FROM agent_notes ORDER BY id DESC LIMIT ?", (limit,))
    return [{"at": clock.display_iso(row["at"]), "step": row["step_id"], "text": clip(row["text"])}
            for row in reversed(rows.fetchall())]


def recent_steps(conn: sqlite3.Connection, *, before_step: int | None = None,
                 limit: int = RECENT_STEPS_SHOWN) -> list[dict[str, Any]]:
    """One condensed summary per recent step, oldest first.

    From `agent_steps` (every policy's steps: what it saw, did, and what was
    refused), and from this module's own record (the llm's tool calls and
    their results, and what it said) for every step.
    """
    summaries: dict[int, dict[str, Any]] = {}
    for row in _agent_step_rows(conn, before_step, limit):
        summaries[row["id"]] = _step_row_summary(row)
    for step_id, messages in _message_groups(conn, before_step, limit):
        summary = summaries.setdefault(step_id, {"step": step_id, "at": clock.display_iso(messages[0]["at"])})
        calls, said = _calls_and_words(messages)
        if "did" not in summary and calls:
            _put_items(summary, "did", calls)
        if said:
            summary["said"] = clip(said, 200)
    return [summaries[key] for key in sorted(summaries)[-limit:]]


def _agent_step_rows(conn: sqlite3.Connection, before_step: int | None, limit: int) -> list[sqlite3.Row]:
    return conn.execute(
        "SELECT * FROM agent_steps WHERE id < ? AND outcome != 'skipped' ORDER BY id DESC LIMIT ?",
        (before_step if before_step is not None else 2**62, limit),
    ).fetchall()


def _step_row_summary(row: sqlite3.Row) -> dict[str, Any]:
    keys = row.keys()
    summary: dict[str, Any] = {"step": row["id"]}
    for column, name in (("started_at", "at"), ("policy", "policy"), ("outcome", "outcome")):
        if column in keys and row[column] is not None:
            summary[name] = clock.display_iso(row[column]) if column == "started_at" else row[column]
    saw = _saw(stored_json(row["observation"], dict))
    if saw:
        summary["saw"] = saw
    for column in ("actions", "refused", "errors"):
        items = stored_json(row[column])
        if items or (column == "actions" and row[column] is not None):  # the step's own account, even of doing nothing
            _put_items(summary, "did" if column == "actions" else column, [_condensed_action(item) for item in items])
    return summary


def _put_items(summary: dict[str, Any], name: str, items: list[Any]) -> None:
    """The first ITEMS_PER_STEP items under `name`, and how many more there were under `name_omitted`."""
    summary[name] = items[:ITEMS_PER_STEP]
    if len(items) > ITEMS_PER_STEP:
        summary[f"{name}_omitted"] = len(items) - ITEMS_PER_STEP


SAW_KEYS = ("capacity", "pending_capacity", "spend_per_hour")
ACTION_KEYS = ("kind", "label", "count", "gpu_name", "offer_id", "reason", "ok", "result", "error", "why", "limit")


def _saw(observation: Any) -> dict[str, Any]:
    """Demand, capacity, spend and fleet size from a stored observation, whatever of them it holds."""
    if not isinstance(observation, dict):
        return {}
    saw: dict[str, Any] = {}
    demand = observation.get("demand")
    if isinstance(demand, dict):
        saw.update({f"demand_{key}": demand[key] for key in ("queued", "known") if key in demand})
    saw.update({key: observation[key] for key in SAW_KEYS if isinstance(observation.get(key), (int, float))})
    machines = observation.get("machines")
    if isinstance(machines, list):
        saw["machines"] = len(machines)
    by_state = observation.get("by_state")  # agent-step keeps the fleet as counts by state (observation_summary)
    if isinstance(by_state, dict):
        saw["by_state"] = by_state
    return saw


def _condensed_action(item: Any) -> Any:
    if isinstance(item, dict):
        nested = found if isinstance(found := item.get("action"), dict) else {}
        merged = {**nested, **{key: value for key, value in item.items() if key != "action"}}
        return clip({key: merged[key] for key in ACTION_KEYS if merged.get(key) is not None}, 120)
    return clip(item, 120)


def _message_groups(conn: sqlite3.Connection, before_step: int | None,
                    limit: int) -> Iterable[tuple[int, list[sqlite3.Row]]]:
    step_ids = [row[0] for row in conn.execute(
        "SELECT DISTINCT step_id FROM agent_messages WHERE step_id IS NOT NULL AND step_id < ?"
        " ORDER BY step_id DESC LIMIT ?", (before_step if before_step is not None else 2**62, limit))]
    for step_id in reversed(step_ids):
        yield step_id, conn.execute(
            "SELECT at, role, content FROM agent_messages WHERE step_id = ? ORDER BY id", (step_id,)).fetchall()


def _calls_and_words(messages: Sequence[sqlite3.Row]) -> tuple[list[dict[str, Any]], str]:
    """The tool calls of one step with what came of each, and the model's last words."""
    calls: dict[str, dict[str, Any]] = {}
    said = ""
    for message in messages:
        try:
            content = json.loads(message["content"])
        except ValueError:
            continue
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                calls[block.get("id", str(len(calls)))] = {"tool": block.get("name"), "input": block.get("input")}
            elif block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                call = calls[block["tool_use_id"]]
                call["ok"] = not block.get("is_error", False)
                call["result"] = _result_text(block.get("content"))
            elif block.get("type") == "text" and message["role"] == "assistant":
                said = block.get("text", "")
    return [clip(call, 120) for call in calls.values()], said


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(block.get("text", "") for block in content if isinstance(block, dict))
    return str(content or "")


# --- the bounded message ---------------------------------------------------------------------------------


@dataclass
class Prompt:
    """The user message that opens a step, and what had to be left out to fit the budget."""

    text: str
    tokens: int
    omitted: dict[str, int] = field(default_factory=dict)


def build_prompt(conn: sqlite3.Connection, *, observation: dict[str, Any], suggestion: Sequence[Mapping[str, object]],
                 step_id: int | None, budget_tokens: int) -> Prompt:
    """The step's opening message, at most `budget_tokens` (estimated) whenever that is possible.

    The observation and suggestion are kept first (compacted if they must be);
    notes and recent steps fill what is left, the oldest dropped first.
    """
    remembered_notes = notes(conn)
    steps = recent_steps(conn, before_step=step_id)
    suggested = clip(list(suggestion)[:SUGGESTION_SHOWN], SUGGESTION_TEXT_CHARS)
    budget_chars = budget_tokens * CHARS_PER_TOKEN
    if len(as_data(suggested)) > budget_chars // 4:  # a plan of long reasons: its actions condensed, then fewer
        condensed = [_condensed_action(item) for item in suggested]
        shown = _most_that_fit(len(condensed), lambda n: len(as_data(condensed[:n])) <= budget_chars // 4)
        suggested = condensed[:shown]
    base_omitted: dict[str, int] = {}
    if len(suggestion) > len(suggested):
        base_omitted["suggestion"] = len(suggestion) - len(suggested)

    def dropped(kept_notes: list[dict[str, Any]], kept_steps: list[dict[str, Any]]) -> dict[str, int]:
        counts = {"notes": len(remembered_notes) - len(kept_notes), "recent_steps": len(steps) - len(kept_steps)}
        return {key: count for key, count in counts.items() if count}

    def render(obs: dict[str, Any], kept_notes: list[dict[str, Any]], kept_steps: list[dict[str, Any]], omitted: dict[str, int]) -> str:
        omitted = {**omitted, **dropped(kept_notes, kept_steps)}
        data = {"notes": kept_notes, "recent_steps": kept_steps, "plan_suggestion": suggested, "observation": obs}
        if omitted:
            data["omitted"] = omitted
        return f"{DATA_OPEN}\n{as_data(data)}\n{DATA_CLOSE}\n{CLOSING}"

    memory_floor = min(len(as_data(remembered_notes)) + len(as_data(steps)), budget_chars // 5)
    frame = len(render({}, [], [], {"suggestion": 0, "machines": 0, "events": 0})) + 40
    fitted, obs_omitted = fit_observation(observation, max(0, budget_chars - frame - memory_floor))
    omitted = {**base_omitted, **obs_omitted}
    kept_notes, kept_steps = _trim_oldest(
        remembered_notes, steps, lambda n, s: len(render(fitted, n, s, omitted)) <= budget_chars)
    text = render(fitted, kept_notes, kept_steps, omitted)
    omitted.update(dropped(kept_notes, kept_steps))
    return Prompt(text=text, tokens=estimate_tokens(text), omitted=omitted)


def _trim_oldest(kept_notes: list[dict[str, Any]], kept_steps: list[dict[str, Any]],
                 fits: Callable[[list[dict[str, Any]], list[dict[str, Any]]], bool]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Drop the oldest note or step summary (by time) until `fits(notes, steps)`."""
    kept_notes, kept_steps = list(kept_notes), list(kept_steps)
    while (kept_notes or kept_steps) and not fits(kept_notes, kept_steps):
        note_at = kept_notes[0].get("at") or "" if kept_notes else None
        step_at = kept_steps[0].get("at") or "" if kept_steps else None
        if step_at is None or (note_at is not None and note_at <= step_at):
            kept_notes.pop(0)
        else:
            kept_steps.pop(0)
    return kept_notes, kept_steps


def fit_observation(observation: dict[str, Any], budget_chars: int) -> tuple[dict[str, Any], dict[str, int]]:
    """The observation within `budget_chars` of JSON, and how many machines and events were left out.

    In order, while over: machines become a table (column names once, without
    TABLE_DROPS) with a summary by state and GPU; only the newest
    EVENTS_WHEN_SHORT events stay; the last actions are condensed, the newest
    LAST_ACTIONS_WHEN_SHORT kept; machine rows are cut, the least in need of
    a decision first (healthy running machines with the best proofs per
    dollar); events are cut, oldest first; last actions likewise; and as a
    last resort every text is cut short and the largest fields emptied (_bare).
    """
    obs = clip(dict(observation))
    omitted: dict[str, int] = {}
    if len(as_data(obs)) <= budget_chars:
        return obs, omitted
    machines = obs.get("machines")
    rows: list[dict[str, Any]] = []
    if isinstance(machines, list) and all(isinstance(m, dict) for m in machines):
        rows = sorted(machines, key=_interest)
        obs["machines_summary"] = _summary(machines)
        obs["machines"] = _table(rows)
    events = obs.get("events") if isinstance(obs.get("events"), list) else []
    if len(as_data(obs)) > budget_chars and len(events) > EVENTS_WHEN_SHORT:
        obs["events"] = events[-EVENTS_WHEN_SHORT:]
        omitted["events"] = len(events) - EVENTS_WHEN_SHORT
    actions = obs.get("last_actions") if isinstance(obs.get("last_actions"), list) else []
    if len(as_data(obs)) > budget_chars and actions:  # what each led to, in few words; the newest
        obs["last_actions"] = [_condensed_action(item) for item in actions[-LAST_ACTIONS_WHEN_SHORT:]]
        if len(actions) > LAST_ACTIONS_WHEN_SHORT:
            omitted["last_actions"] = len(actions) - LAST_ACTIONS_WHEN_SHORT
    if rows and len(as_data(obs)) > budget_chars:
        shown = _most_that_fit(len(rows), lambda n: len(as_data({**obs, "machines": _table(rows[:n])})) <= budget_chars)
        obs["machines"] = _table(rows[:shown])
        omitted["machines"] = len(rows) - shown
    kept_events = obs.get("events") if isinstance(obs.get("events"), list) else []
    if kept_events and len(as_data(obs)) > budget_chars:
        shown = _most_that_fit(len(kept_events),
                               lambda n: len(as_data({**obs, "events": kept_events[len(kept_events) - n:]})) <= budget_chars)
        obs["events"] = kept_events[len(kept_events) - shown:]
        omitted["events"] = len(events) - shown
    kept_actions = obs.get("last_actions") if isinstance(obs.get("last_actions"), list) else []
    if kept_actions and len(as_data(obs)) > budget_chars:
        shown = _most_that_fit(len(kept_actions), lambda n: len(as_data(
            {**obs, "last_actions": kept_actions[len(kept_actions) - n:]})) <= budget_chars)
        obs["last_actions"] = kept_actions[len(kept_actions) - shown:]
        omitted["last_actions"] = len(actions) - shown
    if len(as_data(obs)) > budget_chars:
        obs = _bare(obs, budget_chars, omitted)
    return obs, omitted


def _bare(obs: dict[str, Any], budget_chars: int, omitted: dict[str, int]) -> dict[str, Any]:
    """The last resort: every text cut to SHORT_TEXT_CHARS, then every list and map left empty (counted)."""
    obs = clip(obs, SHORT_TEXT_CHARS)
    omitted["texts_cut_to_chars"] = SHORT_TEXT_CHARS
    for key in sorted(obs, key=lambda name: -len(as_data(obs[name]))):  # the largest first
        if len(as_data(obs)) <= budget_chars:
            break
        value = obs[key]
        if isinstance(value, (list, dict)) and value:
            omitted[key] = omitted.get(key, 0) + len(value)
            obs[key] = type(value)()
        elif isinstance(value, str):
            obs[key] = clip(value, 0)
    return obs


def _most_that_fit(total: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [0, total] with fits(n), for fits monotone (true up to some n)."""
    low, high = 0, total
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


VAST_TROUBLE = frozenset({"exited", "offline", "unknown"})
TABLE_DROPS = ("uuid", "vast_seen_at")  # no tool takes them; a compacted table leaves them out


def _interest(machine: dict[str, Any]) -> tuple[int, float, str]:
    """Machines needing a decision first (in trouble at vast, then on their way or stopped), then
    healthy running ones; within each, the fewest proofs per dollar first."""
    if machine.get("disagreement") or machine.get("vast_missing") or machine.get("vast_status") in VAST_TROUBLE:
        tier = 0
    elif machine.get("state") != "running":
        tier = 1
    else:
        tier = 2
    rate = machine.get("expected_rate") or expected_rate(machine, {}, 0.0)
    dph = machine.get("dph") or 0
    per_dollar = (rate / dph) if dph else float("inf")
    return (tier, per_dollar, str(machine.get("label") or ""))


def _table(machines: list[dict[str, Any]]) -> dict[str, Any]:
    columns: list[str] = []
    for machine in machines:
        columns.extend(key for key in machine if key not in columns and key not in TABLE_DROPS)
    columns = [key for key in columns if any(machine.get(key) is not None for machine in machines)]
    return {"columns": columns, "rows": [[machine.get(key) for key in columns] for machine in machines]}


def _summary(machines: list[dict[str, Any]]) -> dict[str, Any]:
    by_state: dict[str, int] = {}
    by_gpu: dict[str, int] = {}
    for machine in machines:
        by_state[str(machine.get("state"))] = by_state.get(str(machine.get("state")), 0) + 1
        by_gpu[str(machine.get("gpu_name"))] = by_gpu.get(str(machine.get("gpu_name")), 0) + 1
    return {"count": len(machines), "by_state": by_state, "by_gpu": by_gpu,
            "order": "in trouble at vast first, then on their way or stopped, then running; each by proofs per dollar,"
                     " fewest first"}
