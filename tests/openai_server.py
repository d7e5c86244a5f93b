"""A real HTTP server on loopback that speaks the OpenAI chat-completions protocol.

Tests program its replies per model: a list of Reply objects served in order (the last one repeats),
or a function of the request. Every request is recorded with its arrival and reply times, so tests
can see what was sent, how often, and whether calls overlapped.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str = "ok"
    status: int = 200
    delay_s: float = 0.0
    prompt_tokens: int = 10
    completion_tokens: int = 5
    headers: dict[str, str] = field(default_factory=dict)
    logprobs: list[dict[str, Any]] | None = None
    raw_body: bytes | None = None  # send these bytes instead of a completion


@dataclass
class Recorded:
    model: str
    body: dict[str, Any]
    started: float
    finished: float = 0.0
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def user_text(self) -> str:
        return "\n".join(
            m.get("content") or "" for m in self.body.get("messages", []) if m.get("role") == "user"
        )


Program = list[Reply] | Callable[[dict[str, Any]], Reply]
# The reply buffer of a connection: larger than any reply the tests send, so that a reply leaves in one
# write when it is flushed.
REPLY_BUFFER_BYTES = 1 << 16


class OpenAIServer:
    def __init__(self) -> None:
        self.programs: dict[str, Program] = {}
        self.served: dict[str, int] = {}
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.lora_status = 200  # what POST /v1/load_lora_adapter answers
        self.loaded_adapters: dict[str, str] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Answer as fast as a real loopback server: a reply's headers and body go out in one write
            # (a buffered wfile, flushed once per reply) on a socket with TCP_NODELAY. Written in two
            # writes under Nagle's algorithm, the body waited for the client's delayed ACK of the
            # headers: some 40 ms a call, which dwarfed what the benchmarks measure.
            disable_nagle_algorithm = True
            wbufsize = REPLY_BUFFER_BYTES

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(
                        200,
                        {"object": "list", "data": [{"id": m, "object": "model"} for m in server.programs]},
                    )
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                record = Recorded(
                    model=body.get("model", ""),
                    body=body,
                    started=time.monotonic(),
                    headers={k.lower(): v for k, v in self.headers.items()},
                )
                with server.lock:
                    server.requests.append(record)
                if self.path.rstrip("/").endswith("/load_lora_adapter"):  # vLLM's runtime LoRA loading
                    status = server.lora_status
                    record.status, record.finished = status, time.monotonic()
                    if status == 200:
                        server.loaded_adapters[body.get("lora_name", "")] = body.get("lora_path", "")
                    self._send_bytes(status, b"Success" if status == 200 else b"adapter not found")
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "unknown path"}})
                    return
                reply = server.next_reply(record.model, body)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                record.status = reply.status
                record.finished = time.monotonic()
                try:
                    if reply.raw_body is not None:
                        self._send_bytes(reply.status, reply.raw_body, reply.headers)
                    elif reply.status != 200:
                        self._send(
                            reply.status,
                            {"error": {"message": f"scripted {reply.status}", "type": "server_error"}},
                            reply.headers,
                        )
                    else:
                        self._send(200, completion_body(record.model, reply), reply.headers)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                self._send_bytes(status, json.dumps(payload).encode(), headers)

            def _send_bytes(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def program(self, model: str, program: Program) -> None:
        with self.lock:
            self.programs[model] = program
            self.served[model] = 0

    def next_reply(self, model: str, body: dict[str, Any]) -> Reply:
        with self.lock:
            program = self.programs.get(model)
            if program is None:
                return Reply(status=404, content=f"unknown model {model}")
            if callable(program):
                return program(body)
            index = min(self.served[model], len(program) - 1)
            self.served[model] += 1
            return program[index]

    def requests_for(self, model: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.model == model]


def completion_body(model: str, reply: Reply) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": reply.content},
        "finish_reason": "stop",
    }
    if reply.logprobs is not None:
        choice["logprobs"] = {"content": reply.logprobs}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def program_one_step_run(server: Any, outcome: str) -> None:
    """The conductor and worker alpha programmed for a run that ends `outcome`: "succeeded" (a plan of
    one step, answered) or "failed" (the conductor's plan is not JSON)."""
    if outcome == "succeeded":
        server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
        server.program("alpha", [Reply("done")])
    else:
        server.program("conductor", [Reply("{not json")])


def plan_json(*steps: tuple[str, str, Any], thought: str = "test plan") -> str:
    return json.dumps(
        {"thought": thought, "steps": [{"worker": w, "instruction": i, "access": a} for w, i, a in steps]}
    )


def register_pool(server: OpenAIServer) -> tuple[dict[str, Any], Any]:
    """Three workers of two vendors (alpha, beta: acme; gamma: globex) and an active LLM conductor,
    all served by this loopback server (tests' live_pool, bench/chaos)."""
    from decimal import Decimal

    from routing.models import ConductorVersion, Worker

    workers = {}
    for slug, vendor, price_in, price_out in (
        ("alpha", "acme", "1.00", "2.00"),
        ("beta", "acme", "0.50", "1.50"),
        ("gamma", "globex", "3.00", "15.00"),
    ):
        workers[slug] = Worker.objects.create(
            slug=slug,
            display_name=slug.title(),
            litellm_model=f"openai/{slug}",
            api_base=server.base_url,
            vendor=vendor,
            input_usd_per_mtok=Decimal(price_in),
            output_usd_per_mtok=Decimal(price_out),
            price_source=Worker.PriceSource.OVERRIDE,
        )
    ConductorVersion.objects.update(is_active=False)
    conductor = ConductorVersion.objects.create(
        name="llm-test",
        backend=ConductorVersion.Backend.LLM,
        is_active=True,
        config={
            "model": "hosted_vllm/conductor",
            "api_base": server.base_url,
            "input_usd_per_mtok": "0.10",
            "output_usd_per_mtok": "0.20",
        },
    )
    return workers, conductor
