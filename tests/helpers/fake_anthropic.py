"""A local fake of the Anthropic Messages API on 127.0.0.1, for the real SDK to talk to through base_url.

It records every request (path, headers, JSON body) and answers from a
script, in order: a message (`message(...)`), an error status (`error(...)`),
or a callable that gets the request body and returns either. A request past
the end of the script is answered 500, so an unexpected extra round shows up
as a failure, not a hang.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "claude-haiku-5-5"
_ids = itertools.count(1)


@dataclass
class Status:
    """A non-200 answer with an API error body."""

    code: int
    kind: str = "api_error"
    message: str = "Internal server error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Raw:
    """An answer sent byte for byte: what a proxy or a broken API might put in place of a message."""

    code: int
    body: bytes
    content_type: str = "application/json"


def error(code: int, kind: str | None = None, message: str | None = None, retry_after: float | None = None) -> Status:
    kinds = {429: "rate_limit_error", 500: "api_error", 529: "overloaded_error", 400: "invalid_request_error"}
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return Status(code, kind or kinds.get(code, "api_error"), message or f"fake error {code}", headers)


def text(words: str) -> dict:
    return {"type": "text", "text": words}


def tool_use(name: str, tool_input: dict, tool_id: str | None = None) -> dict:
    return {"type": "tool_use", "id": tool_id or f"toolu_fake{next(_ids):04d}", "name": name, "input": tool_input}


def message(*content: dict, stop_reason: str | None = None, input_tokens: int = 100, output_tokens: int = 20,
            cache_read: int = 0, cache_write: int = 0) -> dict:
    """A Messages API reply; stop_reason defaults to tool_use when a tool is called, else end_turn."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
    return {
        "id": f"msg_fake{next(_ids):04d}", "type": "message", "role": "assistant", "model": MODEL,
        "content": list(content), "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": cache_write},
    }


class FakeMessagesAPI:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: deque = deque()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"unparsed": raw.decode("utf-8", "replace")}
                with fake._lock:
                    fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    reply = fake.script.popleft() if fake.script else error(500, message="fake script exhausted")
                if callable(reply):
                    reply = reply(body)
                if self.path.split("?")[0] != "/v1/messages":
                    reply = error(404, "not_found_error", f"no route {self.path}")
                if isinstance(reply, Raw):
                    self._send_raw(reply.code, reply.body, {"content-type": reply.content_type})
                elif isinstance(reply, Status):
                    payload = {"type": "error", "error": {"type": reply.kind, "message": reply.message}}
                    self._send(reply.code, payload, reply.headers)
                else:
                    self._send(200, reply, {})

            def _send(self, code: int, payload: dict, headers: dict[str, str]) -> None:
                self._send_raw(code, json.dumps(payload).encode(), {"content-type": "application/json", **headers})

            def _send_raw(self, code: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(code)
                self.send_header("request-id", f"req_fake{next(_ids):04d}")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, *replies: Any) -> None:
        """Queue replies, one per request, in order."""
        self.script.extend(replies)

    @property
    def bodies(self) -> list[dict]:
        return [request["body"] for request in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


# --- observation dicts of the shape agent-step passes to llm.run (observe.Observation.to_prompt) ---------

GPUS = ("RTX 4090", "RTX 5090")


def machine(index: int, *, state: str = "running", status_msg: str | None = None, gpu: str | None = None) -> dict:
    """One machine as the observation lists it: fleet.instance_view(row) plus expected_rate."""
    gpu = gpu or GPUS[index % len(GPUS)]
    rate = 52.0 + (index % 7) * 3 if state == "running" else None
    return {
        "uuid": f"00000000-0000-4000-8000-{index:012d}", "label": f"vastctl-{index:05d}", "state": state,
        "vast_id": 9_000_000 + index, "vast_status": "running" if state == "running" else "loading",
        "gpu_name": gpu, "num_gpus": 1, "bench_rate": rate, "dph": round(0.35 + (index % 5) * 0.04, 3),
        "proofs_per_hour": rate, "proofs_done": index * 11 if rate else 0,
        "state_since": "2026-05-01T10:00:00Z", "last_heartbeat_at": "2026-05-01T11:59:30Z" if rate else None,
        "kill_reason": None, "kill_code": None, "destroyed_at": None, "vast_missing": 0,
        "vast_seen_at": "2026-05-01T11:59:00Z", "vast_status_msg": status_msg, "disagreement": None,
        "expected_rate": rate or 60.0,
    }


def fleet_observation(machines: int = 3, *, queued: int | None = 59, known: bool = True, events: int = 2,
                      status_msg: str | None = None) -> dict:
    """A fleet of `machines` (every tenth launching, every tenth params_done, the rest running)."""
    listed = [machine(i, state={0: "launching", 1: "params_done"}.get(i % 10, "running"), status_msg=status_msg)
              for i in range(machines)]
    running = [m for m in listed if m["state"] == "running"]
    return {
        "now": "2026-05-01T12:00:00Z",
        "settings": {"target_proofs_per_hour": 60.0 * max(1, machines), "min_bench_rate": 40.0,
                     "max_instances": machines + 10, "max_hourly_spend": 0.6 * (machines + 10), "max_dph": 1.0},
        "demand": {"queued": queued, "proofs_per_hour": 400.0, "at": "2026-05-01T11:58:00Z", "age_s": 120.0,
                   "source": "command", "known": known, "error": None},
        "machines": listed,
        "capacity": sum(m["expected_rate"] for m in running),
        "pending_capacity": 60.0 * (len(listed) - len(running)),
        "spend_per_hour": round(sum(m["dph"] for m in listed), 3),
        "events": [{"id": 100 + i, "at": "2026-05-01T11:59:00Z", "kind": "transition", "uuid": None,
                    "label": f"vastctl-{i:05d}", "from_state": "running", "to_state": "killed",
                    "reason": f"heartbeat_timeout: no heartbeat for 10m (event {i})", "source": "reconcile",
                    "code": "heartbeat_timeout"} for i in range(events)],
        "last_actions": [],
    }
