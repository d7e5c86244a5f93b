"""Live events over a real WebSocket stack: the project's ASGI application (origin check, session
auth, URL routing, the consumer) and the real Redis channel layer from settings.

pytest-asyncio is not installed: each test drives one coroutine with `async_to_sync`, so the
communicator, the application it runs and the channel layer all live on a single event loop. The
engine runs in a worker thread of its own (its own database connection) while that loop listens.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connections, transaction
from django.test import Client

from accounts.models import Role
from audit.chain import run_chain
from audit.models import AuditEvent, ChainHead
from conductor_web.asgi import application
from routing import engine, live_events
from routing.models import Run, Step, Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
ORIGIN = (b"origin", b"http://localhost")


def session_headers(username: str) -> list[tuple[bytes, bytes]]:
    """Log in through Django's auth (a real session row) and return the headers a browser would send."""
    client = Client()
    response = client.post("/login/", {"username": username, "password": PASSWORD})
    assert response.status_code == 302, "the login was refused"
    name = settings.SESSION_COOKIE_NAME
    cookie = client.cookies[name].value
    return [(b"cookie", f"{name}={cookie}".encode()), ORIGIN]


def communicator(task_id, headers) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, f"/ws/tasks/{task_id}/", headers=headers)


def submit(text: str = "What is 6 * 7?") -> Run:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)
    return task.runs.get()


def program_three_steps(server) -> None:
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Solve A", []), ("beta", "Solve B", [0]), ("gamma", "Combine", "all")))],
    )
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, [Reply(f"{slug} says 42")])


def run_engine_in_thread(run_id: int) -> None:
    try:
        engine.execute_run(run_id)
    finally:
        connections.close_all()  # this thread's connections; the test's own stay open


def committed_event(chain: str, seq: int) -> dict | None:
    """The audit row for (chain, seq) as another connection sees it: only committed rows are visible."""
    row = (
        AuditEvent.objects.filter(chain=chain, seq=seq)
        .values("action", "object_type", "object_id", "task_id")
        .first()
    )
    return row


# --- who may connect ------------------------------------------------------------------------------


def test_an_anonymous_connection_is_refused():
    run = submit()

    async def scenario():
        ws = communicator(run.task_id, [ORIGIN])
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    connected, code = async_to_sync(scenario)()
    assert connected is False
    assert code == 4403


def test_a_logged_in_user_without_a_role_is_refused(make_user):
    make_user("norole")
    run = submit()
    headers = session_headers("norole")

    async def scenario():
        ws = communicator(run.task_id, headers)
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    connected, code = async_to_sync(scenario)()
    assert connected is False
    assert code == 4403


def test_a_user_with_a_role_connects_but_not_from_a_foreign_origin(make_user):
    make_user("ann", Role.AUDITOR)
    run = submit()
    headers = session_headers("ann")
    foreign = [h for h in headers if h[0] != b"origin"] + [(b"origin", b"http://evil.example")]

    async def scenario():
        ws = communicator(run.task_id, headers)
        ok, _ = await ws.connect()
        await ws.disconnect()
        other = communicator(run.task_id, foreign)
        refused, _ = await other.connect()
        await other.disconnect()
        not_a_task = communicator("not-a-uuid", headers)
        bad, bad_code = await not_a_task.connect()
        await not_a_task.disconnect()
        nowhere = WebsocketCommunicator(application, "/ws/no-such-thing/", headers=headers)
        unknown, unknown_code = await nowhere.connect()
        await nowhere.disconnect()
        return ok, refused, bad, bad_code, unknown, unknown_code

    ok, refused, bad, bad_code, unknown, unknown_code = async_to_sync(scenario)()
    assert ok is True
    assert refused is False  # the session cookie alone is not enough: cross-site pages are refused
    assert bad is False and bad_code == 4404
    assert unknown is False and unknown_code == 4404  # an unknown path is refused, not a 500


# --- what is delivered ----------------------------------------------------------------------------


def test_a_run_delivers_its_events_after_commit_in_chain_order_and_only_to_its_task(make_user, live_pool):
    server = live_pool["server"]
    program_three_steps(server)
    make_user("olga", Role.OPERATOR)
    headers = session_headers("olga")
    run = submit("Task A")
    other = submit("Task B")
    chain = run_chain(run.correlation_id)
    submitted = AuditEvent.objects.get(chain=chain, action="task.submitted")

    async def receive_run(ws, run_id) -> list[tuple[dict, dict | None]]:
        """Events until run.succeeded, each with the audit row visible at the moment it arrived."""
        engine_done = asyncio.ensure_future(
            sync_to_async(run_engine_in_thread, thread_sensitive=False)(run_id)
        )
        got = []
        try:
            while True:
                event = await ws.receive_json_from(timeout=30)
                row = await sync_to_async(committed_event)(chain_of[event["run"]], event["seq"])
                got.append((event, row))
                if event["action"] in ("run.succeeded", "run.failed"):
                    break
        finally:
            await engine_done
        return got

    chain_of = {run.pk: chain, other.pk: run_chain(other.correlation_id)}

    async def scenario():
        ws_a = communicator(run.task_id, headers)
        ws_b = communicator(other.task_id, headers)
        assert (await ws_a.connect())[0] and (await ws_b.connect())[0]
        try:
            got_a = await receive_run(ws_a, run.pk)
            # run.sealed (written with run.succeeded, in the global chain) must not follow
            assert await ws_a.receive_nothing(timeout=1.0)
            assert await ws_b.receive_nothing(timeout=0.2), "task B's socket saw task A's events"
            got_b = await receive_run(ws_b, other.pk)
            assert await ws_a.receive_nothing(timeout=1.0), "task A's socket saw task B's events"
        finally:
            await ws_a.disconnect()
            await ws_b.disconnect()
        return got_a, got_b

    got_a, got_b = async_to_sync(scenario)()

    run.refresh_from_db()
    assert run.status == "succeeded"
    events = [e for e, _ in got_a]
    assert events, "no live events arrived"
    # Every event was for this run of this task, and its audit row was already committed on arrival.
    for event, row in got_a:
        assert event["run"] == run.pk
        assert row is not None, f"event {event} arrived before its audit row was committed"
        assert (row["action"], row["object_type"], row["object_id"]) == (
            event["action"],
            event["object"],
            event["id"],
        )
        assert row["task_id"] == run.task_id
        assert isinstance(event["sent_at"], float)
    # Gap-free chain numbers: the first follows task.submitted, each next one is one more.
    seqs = [e["seq"] for e in events]
    assert seqs[0] == submitted.seq + 1
    missing = list(
        AuditEvent.objects.filter(chain=chain, seq__gt=submitted.seq)
        .exclude(seq__in=seqs)
        .order_by("seq")
        .values_list("seq", "action")
    )
    assert not missing, f"events of the run's chain never sent live (a gap for every watcher): {missing}"
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert events[0]["action"] == "run.started"
    assert events[-1]["action"] == "run.succeeded"
    assert "run.sealed" not in {e["action"] for e in events}
    # Nothing of the run's chain was left out: the last event is the chain's final head.
    head = ChainHead.objects.get(chain=chain)
    assert head.sealed and head.seq == seqs[-1]
    expected = list(
        AuditEvent.objects.filter(chain=chain, seq__gt=submitted.seq)
        .order_by("seq")
        .values_list("seq", "action", "object_type", "object_id")
    )
    assert [(e["seq"], e["action"], e["object"], e["id"]) for e in events] == expected
    # The three steps each started and succeeded, announced with their own ids.
    step_ids = {str(pk) for pk in Step.objects.filter(run=run).values_list("pk", flat=True)}
    assert len(step_ids) == 3
    for action in ("step.started", "step.succeeded"):
        assert {e["id"] for e in events if e["action"] == action and e["object"] == "step"} == step_ids

    # Task B's socket got task B's run, and only that.
    events_b = [e for e, _ in got_b]
    assert {e["run"] for e in events_b} == {other.pk}
    assert events_b[0]["seq"] == 2 and events_b[-1]["action"] == "run.succeeded"


def test_publish_on_commit_sends_nothing_before_commit_nor_when_the_transaction_rolls_back(make_user):
    make_user("ann", Role.AUDITOR)
    headers = session_headers("ann")
    task_id = uuid.uuid4()  # the group is all that matters here; no row is needed

    def publish(seq: int, *, rollback: bool) -> None:
        with transaction.atomic():
            live_events.publish_on_commit(
                task_id=task_id, events=[{"run": 1, "seq": seq, "action": "test.event"}]
            )
            # Still inside the transaction: nothing may have been sent yet.
            assert async_to_sync(ws.receive_nothing)(timeout=0.5), "sent before the commit"
            if rollback:
                transaction.set_rollback(True)

    async def scenario():
        nonlocal ws
        ws = communicator(task_id, headers)
        assert (await ws.connect())[0]
        try:
            await sync_to_async(publish)(1, rollback=True)
            rolled_back_quiet = await ws.receive_nothing(timeout=1.0)
            await sync_to_async(publish)(2, rollback=False)
            committed = await ws.receive_json_from(timeout=5)
            after = await ws.receive_nothing(timeout=0.5)
        finally:
            await ws.disconnect()
        return rolled_back_quiet, committed, after

    ws: WebsocketCommunicator | None = None
    rolled_back_quiet, committed, after = async_to_sync(scenario)()
    assert rolled_back_quiet, "an event of a rolled-back transaction was sent"
    assert committed["seq"] == 2 and committed["action"] == "test.event"
    assert isinstance(committed["sent_at"], float)
    assert after


# --- nobody watching --------------------------------------------------------------------------------


def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def _calls(*commands: str) -> int:
    """How many times Redis ran these commands (INFO commandstats): ZRANGE is what channels-redis's
    group_send runs to list a group, ZCARD what the publisher asks while it is not listening."""
    stats = _redis().info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)


def _listening(timeout_s: float = 10.0) -> set[str]:
    """This process's publisher follows the watchers: its groups, once it does."""
    publisher = live_events._publisher()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with publisher.wake:
            if publisher.watchers is not None and publisher.watchers.groups is not None:
                return set(publisher.watchers.groups)
        time.sleep(0.01)
    raise AssertionError("the publisher does not listen on the live watch channel")


def _watch(group: str, channel: str) -> None:
    from channels.layers import get_channel_layer

    async_to_sync(live_events.watch)(get_channel_layer(), group, channel)


def _unwatch(group: str, channel: str) -> None:
    from channels.layers import get_channel_layer

    async_to_sync(live_events.unwatch)(get_channel_layer(), group, channel)


def _received(channel: str, timeout_s: float = 5.0) -> dict:
    from channels.layers import get_channel_layer

    async def receive() -> dict:
        return await asyncio.wait_for(get_channel_layer().receive(channel), timeout=timeout_s)

    return async_to_sync(receive)()


def test_events_of_a_task_nobody_watches_cost_no_redis_command_and_a_watched_tasks_are_sent():
    from channels.layers import get_channel_layer

    unwatched, watched = uuid.uuid4(), uuid.uuid4()
    layer = get_channel_layer()
    live_events.publish(
        task_id=unwatched, event={"run": 1, "seq": 0, "action": "test.start"}
    )  # the publisher runs
    assert live_events.flush()
    _listening()
    channel = async_to_sync(layer.new_channel)()
    _watch(live_events.task_group(watched), channel)
    try:
        admin = _redis()
        own = {"cmdstat_info", "cmdstat_hello", "cmdstat_client"}  # this client's own connection and asking

        def commands() -> dict[str, int]:
            return {k: v["calls"] for k, v in admin.info("commandstats").items() if k not in own}

        before = commands()
        for seq in range(1, 6):
            live_events.publish(task_id=unwatched, event={"run": 1, "seq": seq, "action": "test.unwatched"})
        assert live_events.flush()
        # Not a command for them: no group listed (ZRANGE), no membership asked (ZCARD), nothing sent.
        assert commands() == before

        reads = _calls("zrange")
        live_events.publish(task_id=unwatched, event={"run": 1, "seq": 6, "action": "test.unwatched"})
        live_events.publish(task_id=watched, event={"run": 2, "seq": 1, "action": "test.watched"})
        assert live_events.flush()
        assert _calls("zrange") == reads + 1  # the watched task's event alone went through group_send
        received = _received(channel)
        assert received["event"]["action"] == "test.watched" and received["event"]["seq"] == 1
    finally:
        _unwatch(live_events.task_group(watched), channel)


def test_a_task_is_followed_while_it_has_a_watcher_and_no_longer_once_its_last_one_left():
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    task_id = uuid.uuid4()
    group = live_events.task_group(task_id)
    live_events.publish(task_id=task_id, event={"run": 1, "seq": 0, "action": "test.start"})
    assert live_events.flush()
    assert group not in _listening()
    first, second = async_to_sync(layer.new_channel)(), async_to_sync(layer.new_channel)()
    _watch(group, first)
    _watch(group, second)
    try:
        live_events.publish(task_id=task_id, event={"run": 1, "seq": 1, "action": "test.both"})
        assert live_events.flush()
        assert _received(first)["event"]["seq"] == 1 and _received(second)["event"]["seq"] == 1

        _unwatch(group, first)  # the other still watches
        live_events.publish(task_id=task_id, event={"run": 1, "seq": 2, "action": "test.one"})
        assert live_events.flush()
        assert _received(second)["event"]["seq"] == 2
        assert group in _listening()
    finally:
        _unwatch(group, second)
    reads = _calls("zrange")
    live_events.publish(task_id=task_id, event={"run": 1, "seq": 3, "action": "test.none"})
    assert live_events.flush()
    assert _calls("zrange") == reads  # nobody left: not sent
    assert group not in _listening()


def test_a_watcher_who_joined_while_the_publisher_did_not_listen_gets_the_events():
    """The watch channel lost (its connection killed: a Redis restart, a network cut), and a watcher
    joins meanwhile, its announcement lost: the publisher asks Redis for each batch until it listens
    again, then lists the groups anew."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    task_id = uuid.uuid4()
    group = live_events.task_group(task_id)
    live_events.publish(task_id=task_id, event={"run": 1, "seq": 0, "action": "test.start"})
    assert live_events.flush()
    _listening()
    channel = async_to_sync(layer.new_channel)()
    _redis().client_kill_filter(_type="pubsub")  # every subscription's connection closed by the server
    async_to_sync(layer.group_add)(group, channel)  # joined, unannounced while nobody listens
    try:
        live_events.publish(task_id=task_id, event={"run": 1, "seq": 1, "action": "test.during"})
        assert live_events.flush()
        assert _received(channel)["event"]["seq"] == 1
        assert group in _listening()  # listened again: the group listed with the others
        live_events.publish(task_id=task_id, event={"run": 1, "seq": 2, "action": "test.after"})
        assert live_events.flush()
        assert _received(channel)["event"]["seq"] == 2
    finally:
        _unwatch(group, channel)


def test_a_reconnected_subscription_is_listed_again_and_its_old_connection_reused_elsewhere_is_not_one():
    """redis-py reconnects a subscription by itself (what was announced meanwhile is lost): the
    publisher lists the groups again, on a new subscription, and closes the old one, whose connection
    goes back to the client's pool. When that connection is reused for a plain command and connects
    again, that is not the watch channel's reconnection: the publisher keeps listening."""
    live_events.publish(task_id=uuid.uuid4(), event={"run": 1, "seq": 0, "action": "test.start"})
    assert live_events.flush()
    _listening()
    publisher = live_events._publisher()
    watchers = publisher.watchers
    assert watchers is not None
    with publisher.wake:
        first = watchers.subscriptions[0]
        first.connection.disconnect()  # dropped: the next read reconnects it
        assert watchers.known() is None  # reconnected while reading: not known until listed again
    live_events.publish(task_id=uuid.uuid4(), event={"run": 1, "seq": 0, "action": "test.wake"})
    assert live_events.flush()
    _listening()
    with publisher.wake:
        assert first not in watchers.subscriptions
        reused = [watchers.clients[0].exists("conductor-test-nothing") for _ in range(3)]
        assert reused == [0, 0, 0]
        assert watchers.known() is not None, "a pooled connection's reconnection stopped the listening"


def test_a_watched_tasks_event_is_sent_after_the_publishers_connection_died_while_idle():
    """The publisher's event loop only sends for watched tasks, so its Redis connection may sit idle
    for long: one that died meanwhile (Redis restarted, the client killed) loses no event."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    task_id = uuid.uuid4()
    channel = async_to_sync(layer.new_channel)()
    _watch(live_events.task_group(task_id), channel)
    try:
        live_events.publish(task_id=task_id, event={"run": 1, "seq": 1, "action": "test.before"})
        assert live_events.flush()
        assert _received(channel)["event"]["seq"] == 1
        # Every client connection but this one is closed by the server, the publisher's included.
        _redis().client_kill_filter(_type="normal", skipme=True)
        live_events.publish(task_id=task_id, event={"run": 1, "seq": 2, "action": "test.after"})
        assert live_events.flush()

        async def seqs_received() -> list[int]:
            got: list[int] = []
            while 2 not in got:  # the kill may hand this test's own receive the first one again
                got.append((await asyncio.wait_for(layer.receive(channel), timeout=5))["event"]["seq"])
            return got

        assert 2 in async_to_sync(seqs_received)()
    finally:
        _unwatch(live_events.task_group(task_id), channel)
