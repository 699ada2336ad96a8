"""`vastctl agent-step --policy llm` end to end: the real agent.llm and Anthropic SDK against the local fake
Messages API (helpers/fake_anthropic.py), a stand-in market, and the requests, rows and output that result."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers.agent_cli import opening, running, step_json
from helpers.fake_anthropic import Raw, error, message, text, tool_use
from helpers.serving import query

from vastctl.agent import memory

TOOL_ORDER = ["launch", "destroy", "stop", "start", "rebid", "search_offers", "note"]
PRICES = (0.10, 0.50, 0.01, 0.125)  # the default model's $ per million tokens (docs/interface.md, agent.prices)
NOTE = "vastctl-a is the only running machine: never release it while proofs are queued"


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py)."""


@pytest.mark.slow
def test_an_llm_step_end_to_end(ready, cli, market, llm_api, db_path):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    stop = tool_use("stop", {"label": "vastctl-a"})
    launch = tool_use("launch", {"count": 1, "gpu_name": "RTX 4090"})
    llm_api.answer(message(text("Short of target; the queue is long."), stop, launch,
                           tool_use("note", {"text": NOTE}), input_tokens=3000, output_tokens=120, cache_write=900),
                   message(text("Launched one; the stop was refused."), input_tokens=3400, output_tokens=30,
                           cache_read=900))

    data = step_json(cli)

    # the first request: the tools in their fixed order, the fleet, the demand and the events so far
    first, second = llm_api.bodies
    assert [tool["name"] for tool in first["tools"]] == TOOL_ORDER
    seen = opening(first)
    observation = seen["observation"]
    assert [(m["label"], m["state"]) for m in observation["machines"]] == [("vastctl-a", "running")]
    assert observation["demand"]["queued"] == 500 and observation["demand"]["known"] is True
    assert observation["capacity_proofs_per_hour"] == 70
    assert [e["to_state"] for e in observation["events"]] == ["registered", "params_done", "bench_done", "running"]
    assert seen["plan_suggestion"][0]["kind"] == "launch" and seen["notes"] == [] and seen["recent_steps"] == []

    # the second: what came of each call, the refusal an error naming its limit
    results = {block["tool_use_id"]: block for block in second["messages"][2]["content"]}
    assert results[stop["id"]]["is_error"] is True and "never_scale_to_zero" in results[stop["id"]]["content"]
    assert results[launch["id"]]["is_error"] is False and "launched vastctl-" in results[launch["id"]]["content"]

    # what was bought, and what the step says and keeps
    assert [call for call in market.calls if call[0] == "create"] == [("create", 1)]
    assert query(db_path, "SELECT state FROM instances WHERE label = 'vastctl-a'") == [{"state": "running"}]
    tokens = {"input": 6400, "output": 150, "cache_read": 900, "cache_write": 900}
    cost = sum(tokens[kind] * price for kind, price in zip(tokens, PRICES)) / 1_000_000
    assert (data["policy"], data["outcome"], data["skipped"], data["errors"]) == ("llm", "ok", False, [])
    assert data["tokens"] == tokens and data["cost"] == round(cost, 6)  # to the micro-dollar
    assert [(a["kind"], a["gpu_name"]) for a in data["actions"]] == [("launch", "RTX 4090")]
    assert [(r["kind"], r["label"], r["limit"]) for r in data["refused"]] == [("stop", "vastctl-a",
                                                                             "never_scale_to_zero")]
    (row,) = query(db_path, "SELECT * FROM agent_steps")
    assert (row["policy"], row["outcome"]) == ("llm", "ok")
    assert (row["input_tokens"], row["output_tokens"], row["cache_read_tokens"], row["cache_write_tokens"]) == (
        6400, 150, 900, 900)
    assert row["cost"] == pytest.approx(cost)
    assert [a["kind"] for a in json.loads(row["refused"])] == ["stop"]
    assert query(db_path, "SELECT step_id, text FROM agent_notes") == [{"step_id": row["id"], "text": NOTE}]

    # the next step: the note, an account of the step before, and only the events after its cursor
    assert cli("notify", "Curio maintenance at 02:00").code == 0
    llm_api.answer(message(text("Holding.")))
    data = step_json(cli)
    assert data["actions"] == [] and data["tokens"]["input"] == 100
    seen = opening(llm_api.bodies[2])
    assert [note["text"] for note in seen["notes"]] == [NOTE]
    (before,) = seen["recent_steps"]
    assert before["step"] == row["id"] and before["saw"]["demand_queued"] == 500
    assert before["saw"]["by_state"] == {"running": 1} and before["saw"]["capacity"] == 70
    assert [(a["kind"], a["limit"]) for a in before["refused"]] == [("stop", "never_scale_to_zero")]
    assert [a["kind"] for a in before["did"]] == ["launch"]
    events = seen["observation"]["events"]
    assert min(e["id"] for e in events) > max(e["id"] for e in observation["events"])
    assert ("note", "Curio maintenance at 02:00") in [(e["kind"], e["reason"]) for e in events]
    assert [m["label"] for m in seen["observation"]["machines"]][0] == "vastctl-a"
    assert len(seen["observation"]["machines"]) == 2  # the one launched last step, on its way


@pytest.mark.slow
@pytest.mark.parametrize("status", [500, 529])
def test_an_api_error_buys_nothing_and_exits_1(ready, cli, market, llm_api, db_path, status):
    assert cli("demand", "report", "--queued", "59").code == 0
    llm_api.answer(error(status, retry_after=0), error(status, retry_after=0))
    result = cli("agent-step", "--policy", "llm", "--json")
    assert result.code == 1
    assert result.err.strip().splitlines()[-1].startswith("error: llm: Anthropic API error")
    assert f"HTTP {status}" in result.err
    data = json.loads(result.out)
    assert (data["policy"], data["outcome"], data["actions"]) == ("llm", "error", [])
    assert len(llm_api.requests) == 2  # one retry within the step, no more
    assert [call for call in market.calls if call[0] != "search"] == []
    assert query(db_path, "SELECT count(*) AS n FROM instances") == [{"n": 0}]
    (row,) = query(db_path, "SELECT outcome, errors, input_tokens, cost FROM agent_steps")
    assert (row["outcome"], row["input_tokens"], row["cost"]) == ("error", 0, 0.0)
    assert f"HTTP {status}" in json.loads(row["errors"])[0]


def test_without_a_key_policy_llm_is_bad_input(ready, cli, market, db_path):
    result = cli("agent-step", "--policy", "llm")
    assert result.code == 2 and "ANTHROPIC_API_KEY" in result.err and result.err.startswith("error: ")
    assert market.calls == [] and query(db_path, "SELECT count(*) AS n FROM agent_steps") == [{"n": 0}]


@pytest.mark.slow
@pytest.mark.parametrize(("stop_reason", "says"), [
    ("refusal", "the model declined to answer"),
    ("max_tokens", "the reply was cut at its token limit (its tool calls were not run)"),
])
def test_a_step_the_model_cuts_short_ran_and_says_why(ready, cli, market, llm_api, db_path, stop_reason, says):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "59").code == 0
    llm_api.answer(message(tool_use("launch", {"count": 1, "gpu_name": "RTX 4090"}), stop_reason=stop_reason))
    data = step_json(cli)
    assert (data["outcome"], data["actions"], data["errors"]) == ("ok", [], [f"llm: {says} after 1 round(s)"])
    assert [call for call in market.calls if call[0] == "create"] == []
    llm_api.answer(message(text("I would rather not."), stop_reason=stop_reason))
    result = cli("agent-step", "--policy", "llm")
    assert result.code == 0 and f"warning: llm: {says}" in result.err
    assert [r["outcome"] for r in query(db_path, "SELECT outcome FROM agent_steps")] == ["ok", "ok"]


def _without(key: str, reply: dict) -> dict:
    reply = dict(reply)
    del reply[key]
    return reply


@pytest.mark.slow
@pytest.mark.parametrize(("reply", "says"), [
    (Raw(200, b"<html><body>502 Bad Gateway</body></html>", "text/html"), "not a message"),
    (Raw(200, b'{"id": "msg_1", "type": "mess', "application/json"), "not a message"),
    (Raw(200, b"[1, 2, 3]", "application/json"), "not a message"),
    (_without("usage", message(text("fine"))), "without usage"),
    (_without("content", message(text("fine"))), "not a message"),
    ({**message(text("fine")), "usage": {"input_tokens": "many", "output_tokens": -3}}, "without usage"),
])
def test_a_reply_that_is_not_a_message_is_a_clear_error_with_the_steps_json(ready, cli, market, llm_api, db_path,
                                                                             reply, says):
    assert cli("demand", "report", "--queued", "59").code == 0
    llm_api.answer(reply)
    result = cli("agent-step", "--policy", "llm", "--json")
    assert result.code == 1
    last = result.err.strip().splitlines()[-1]
    assert last.startswith("error: llm: the Messages API answered") and says in last, result.err
    assert "unexpected" not in result.err and "Traceback" not in result.err
    assert "Bad Gateway" not in result.err  # a proxy's page is hostile text: described, never echoed
    data = json.loads(result.out)
    assert (data["policy"], data["outcome"], data["actions"]) == ("llm", "error", [])
    assert len(llm_api.requests) == 1  # a broken answer is not retried within the step: the next tick is
    (row,) = query(db_path, "SELECT outcome, errors FROM agent_steps")
    assert row["outcome"] == "error" and says in json.loads(row["errors"])[0]


@pytest.mark.slow
def test_a_step_that_never_reaches_the_model_is_not_ok(ready, cli, market, llm_api, db_path, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text("agent:\n  max_rounds: 1\n  deadline: 4s\n")  # under llm.MIN_ROUND_S: no round can start
    assert cli("demand", "report", "--queued", "59").code == 0
    result = cli("--config", str(config), "agent-step", "--policy", "llm", "--json")
    assert result.code == 1, result.err
    data = json.loads(result.out)
    assert data["outcome"] == "error" and "the model was not asked" in data["errors"][0]
    assert llm_api.requests == []


# --- the rebid tool: the guard-checked, audited action the rules policy emits -----------------------------


@pytest.fixture
def bid_market(market):
    """The stand-in market, able to change a bid (vast's PUT instances/bid_price/ID)."""
    market.change_bid = lambda vast_id, price: market.calls.append(("change_bid", vast_id, price))
    return market


def outbid(cli, db_path, label="vastctl-b", vast_id=501, bid=0.3):
    """A running interruptible machine vast paused for a higher bid."""
    running(cli, label, vast_id=vast_id)
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE instances SET bid = ?, dph = ?, ask_dph = 0.6, outbid_since = '2026-05-01T11:50:00Z'"
                    " WHERE label = ?", (bid, bid, label))


def rebid_step(cli, llm_api, tool_input):
    call = tool_use("rebid", tool_input)
    llm_api.answer(message(call), message(text("done")))
    data = step_json(cli)
    (result,) = llm_api.bodies[1]["messages"][2]["content"]
    assert result["tool_use_id"] == call["id"]
    return data, result


@pytest.mark.slow
def test_a_rebid_call_raises_the_bid_through_the_guard_and_is_audited(ready, cli, bid_market, llm_api, db_path):
    running(cli, "vastctl-a")
    outbid(cli, db_path)
    data, result = rebid_step(cli, llm_api, {"label": "vastctl-b", "bid": 0.4, "reason": "outbid for 10m"})

    brief = {m["label"]: m for m in opening(llm_api.bodies[0])["observation"]["machines"]}["vastctl-b"]
    assert (brief["rental"], brief["bid"], brief["ask_dph"]) == ("interruptible", 0.3, 0.6)
    assert brief["outbid_since"] == "2026-05-01T11:50:00Z"
    assert "rental" not in {m["label"]: m for m in opening(llm_api.bodies[0])["observation"]["machines"]}["vastctl-a"]
    assert result["is_error"] is False and "bid $0.4/h" in result["content"]
    assert [c for c in bid_market.calls if c[0] == "change_bid"] == [("change_bid", 501, 0.4)]
    assert [(a["kind"], a["label"], a["dph"], a["result"]) for a in data["actions"]] == [
        ("rebid", "vastctl-b", 0.4, "bid $0.4/h")]
    assert data["refused"] == []
    assert query(db_path, "SELECT bid, dph FROM instances WHERE label = 'vastctl-b'") == [{"bid": 0.4, "dph": 0.4}]
    (audit,) = query(db_path, "SELECT actor, kind, label, ok, request FROM actions WHERE kind = 'rebid'")
    assert (audit["actor"], audit["label"], audit["ok"]) == ("agent", "vastctl-b", 1)
    assert json.loads(audit["request"]) == {"price": 0.4}


@pytest.mark.slow
def test_a_bid_above_max_dph_is_refused_by_the_guard(ready, cli, bid_market, llm_api, db_path):
    running(cli, "vastctl-a")
    outbid(cli, db_path)
    data, result = rebid_step(cli, llm_api, {"label": "vastctl-b", "bid": 5.0})

    assert result["is_error"] is True and "max_dph" in result["content"]
    assert [c for c in bid_market.calls if c[0] == "change_bid"] == []
    assert data["actions"] == []
    assert [(r["kind"], r["label"], r["limit"]) for r in data["refused"]] == [("rebid", "vastctl-b", "max_dph")]
    assert query(db_path, "SELECT bid FROM instances WHERE label = 'vastctl-b'") == [{"bid": 0.3}]
    (audit,) = query(db_path, "SELECT actor, kind, ok, result FROM actions")
    assert (audit["actor"], audit["kind"], audit["ok"]) == ("agent", "rebid", 0)
    assert audit["result"].startswith("refused by the guard (max_dph)")


@pytest.mark.slow
@pytest.mark.parametrize("tool_input,says", [
    ({"label": "vastctl-b", "bid": -0.1}, "rebid.bid must be above 0, got -0.1"),
    ({"label": "vastctl-b", "bid": 0}, "rebid.bid must be above 0, got 0"),
    ({"label": "vastctl-b", "bid": "0.4"}, 'rebid.bid must be a number, got "0.4"'),
    ({"label": "vastctl-b", "bid": True}, "rebid.bid must be a number, got true"),
    ({"label": "vastctl-b", "bid": 10**400}, f"rebid.bid must be a finite number, got 1{'0' * 59}"),
    ({"label": "vastctl-b"}, "rebid needs 'bid'"),
    ({"bid": 0.4}, "rebid needs 'label'"),
    ({"label": "vastctl-b", "bid": 0.4, "price": 0.4},
     "rebid takes no argument 'price' (it takes label, bid, reason)"),
])
def test_an_invalid_rebid_is_a_tool_error_and_nothing_is_guarded_or_run(ready, cli, bid_market, llm_api, db_path,
                                                                          tool_input, says):
    running(cli, "vastctl-a")
    outbid(cli, db_path)
    data, result = rebid_step(cli, llm_api, tool_input)

    told = json.loads(result["content"].removeprefix(memory.DATA_OPEN).removesuffix(memory.DATA_CLOSE))
    assert result["is_error"] is True and told == {"ok": False, "result": f"not run: {says}"}
    assert [c for c in bid_market.calls if c[0] == "change_bid"] == []
    assert (data["actions"], data["refused"]) == ([], [])
    assert query(db_path, "SELECT count(*) AS n FROM actions") == [{"n": 0}]
