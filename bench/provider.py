"""A loopback provider for the benchmarks: an OpenAI-protocol HTTP server on this machine whose
models answer after a fixed delay, and the replay pool's workers pointed at it.

The static conductor plans with the replay pool's worker names; pointed at this server (model
`openai/<slug>`, its address), the same plans make real HTTP calls that take `delay_s` each. What
`point_pool_at` changed is put back by `restore`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.openai_server import OpenAIServer, Reply

ANSWER = "The answer is 42."


def provider_start() -> OpenAIServer:
    """The server, started (its models are given by `point_pool_at`), counting the CPU time its
    threads spend on each request (`provider_cpu_s`): the benchmark's own part of its process's time."""
    server = OpenAIServer()
    handler = server.httpd.RequestHandlerClass
    answer = handler.handle_one_request
    spent, lock = [0.0], threading.Lock()

    def handle_one_request(self: Any) -> None:  # a request's reading, answering and writing
        started = time.thread_time()
        try:
            answer(self)
        finally:
            with lock:
                spent[0] += time.thread_time() - started

    handler.handle_one_request = handle_one_request  # type: ignore[method-assign]
    server.cpu_spent = spent  # type: ignore[attr-defined]
    return server.start()


def provider_cpu_s(server: OpenAIServer) -> float:
    """CPU seconds the server's threads have spent on requests so far (a server of `provider_start`)."""
    return float(server.cpu_spent[0])  # type: ignore[attr-defined]


def point_pool_at(server: OpenAIServer, delay_s: float) -> list[tuple[str, dict[str, Any]]]:
    """Point every enabled worker at `server` (each answering after `delay_s`); what each was before,
    for `restore`."""
    from audit.services import Actor
    from routing.models import Worker
    from routing.services import worker_upsert

    actor = Actor.service("bench")
    before = []
    for worker in Worker.objects.filter(enabled=True).order_by("slug"):
        before.append((worker.slug, {"litellm_model": worker.litellm_model, "api_base": worker.api_base}))
        server.program(worker.slug, [Reply(ANSWER, delay_s=delay_s)])
        worker_upsert(
            slug=worker.slug,
            fields={"litellm_model": f"openai/{worker.slug}", "api_base": server.base_url},
            actor=actor,
        )
    return before


def restore(before: list[tuple[str, dict[str, Any]]]) -> None:
    """Put the workers' endpoints back as `point_pool_at` found them."""
    from audit.services import Actor
    from routing.services import worker_upsert

    actor = Actor.service("bench")
    for slug, fields in before:
        worker_upsert(slug=slug, fields=fields, actor=actor)
