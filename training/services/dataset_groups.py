"""The groups of a GRPO dataset, streamed from the finished rollouts in item order: each item's samples
rewarded, with their advantages and the conductor's prompt, and handed to the files."""

from __future__ import annotations

import gc
import hashlib
import threading
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast
from psycopg.adapt import Loader

from routing.conductors import LLMConductor
from routing.engine.planning import plan_request, screened_workers
from routing.models import Decision, Task

from ..models import Rollout
from ..rewards import RewardConfig, group_advantages, reward_of
from .common import TrainingError
from .dataset_writer import Group, GroupFiles, json_text


def conductor_prompt(task: Task, pools: dict[str, list[Any]] | None = None) -> list[dict[str, str]]:
    """The messages an LLM conductor is given for this task with today's pool (the GRPO prompt).
    `pools`: the screened pool per data class, kept across the tasks of one build (recorded items
    all: the replay workers recorded every one)."""
    if pools is not None and task.classification in pools:
        workers = pools[task.classification]
    else:
        workers, _ = screened_workers(task)
        if pools is not None:
            pools[task.classification] = workers
    request = plan_request(task, workers, remaining_steps=task.max_steps, depth=0)
    if not workers:
        raise TrainingError(f"no enabled worker may receive {task.classification} data: no prompt to write")
    return LLMConductor({"model": "conductor"}).messages(request)


def split_of(item: str, validation_fraction: float) -> str:
    bucket = int(hashlib.sha256(item.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "validation" if bucket < validation_fraction else "train"


class _Paused:
    """Builds under way in this process, and whether the collector ran before the first began."""

    lock = threading.Lock()
    builds = 0
    was_enabled = True


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while the rows stream through (put back as it was, whatever
    happens). The build allocates some ten containers a sample and makes no cycles (a build of 160,000
    samples left 31 objects for the collector afterwards, as many as one of 20,000), but the collector
    ran some 280 times over them and over the process's older objects (0.84 s of an 8.4 s build,
    holding the GIL; one full collection alone took 0.4 s). The switch is the process's: the first of
    concurrent builds turns it off, the last one puts it back as the first found it, and meanwhile
    other threads' cycles (a web server's, where a request builds) wait for the builds' end."""
    with _Paused.lock:
        if _Paused.builds == 0:
            _Paused.was_enabled = gc.isenabled()
            gc.disable()
        _Paused.builds += 1
    try:
        yield
    finally:
        with _Paused.lock:
            _Paused.builds -= 1
            if _Paused.builds == 0 and _Paused.was_enabled:
                gc.enable()


FETCH = 2000  # rollout rows per round trip (some 3 MB of plans; the next read while these are used)
MEMO = 4096  # rewards (and advantages) kept for reuse; costs vary by run, so this is bounded too


@dataclass
class Built:
    groups: int = 0  # items with at least one graded sample
    kept: int = 0  # of those, with at least min_group_size
    ungraded: int = 0
    with_signal: int = 0
    spread_sum: float = 0.0
    run_ids: list[int] = field(default_factory=list)


class Prompts:
    """Each group's conductor prompt as JSON. The messages differ between tasks only in the task's text:
    they are built and encoded once per domain, data class and step and depth limits (by
    `conductor_prompt` itself, for a marker text), and each task's text, encoded alone, is put in the
    marker's place."""

    MARK = "\x00task text\x00"
    PROBE = ' a longer "probe" \\ text, é ✓ \u2028\n\x01 ' * 8  # checks the template MARK made

    def __init__(self) -> None:
        self._pools: dict[str, list[Any]] = {}
        self._shapes: dict[tuple[Any, ...], tuple[str, str] | None] = {}

    def of(self, text: str, *, item: str, **shape: Any) -> str:
        """The messages for a task's text and `shape` (its domain, classification, max_steps and
        max_depth), as json.dumps writes them (ensure_ascii=False). `item`: the recorded item the task
        is, so that the pool is the one such a task is offered (the replay workers that recorded it)."""
        key = tuple(shape.values())
        if key not in self._shapes:
            self._shapes[key] = self._template(item=item, **shape)
        template = self._shapes[key]
        if template is None:  # the prompt uses the text some other way: each prompt built on its own
            return json_text(conductor_prompt(Task(text=text, source_item=item, **shape), self._pools))
        head, tail = template
        return head + json_text(text)[1:-1] + tail

    def _template(self, *, item: str, **shape: Any) -> tuple[str, str] | None:
        """The messages' JSON before and after the text's place. A JSON string escapes each character
        on its own, so the text's JSON (without its quotes) put there gives the JSON of the messages with
        the text in its place, if the prompt holds the text once, as it is, and nothing else of it: a
        second text, longer and with escapes, must come out of the template as the prompt writes it."""
        encoded = json_text(conductor_prompt(Task(text=self.MARK, source_item=item, **shape), self._pools))
        marker = json_text(self.MARK)[1:-1]
        if encoded.count(marker) != 1:
            return None  # the text is placed more than once, or changed on its way
        head, tail = encoded.split(marker)
        probe = conductor_prompt(Task(text=self.PROBE, source_item=item, **shape), self._pools)
        if head + json_text(self.PROBE)[1:-1] + tail != json_text(probe):
            return None  # the prompt depends on the text some other way (its length, a copy changed)
        return head, tail


class PlanBytes(Loader):
    """A plan's JSON string (PostgreSQL's `json` type) as the UTF-8 bytes PostgreSQL sent: it goes into
    the JSON Lines as it is, never decoded into a Python string and encoded again."""

    def load(self, data: Any) -> bytes:
        return bytes(data)


# The rollouts' rows in item order, each with its run's last top-level plan as a JSON string (written by
# PostgreSQL: its escapes are json.dumps's) and whether any of its top-level plans parsed. One lateral
# look-up per rollout reads both (instead of two correlated subqueries); `rollouts` is the filtered
# selection as the ORM writes it, its columns named here.
_ROWS = """
SELECT r.item, r.run_id, r.score, r.task_id, r.cost_text,
    to_json(coalesce(d.plan, '')), coalesce(d.parsed, false)
FROM ({rollouts}) AS r (item, run_id, score, task_id, cost_text)
CROSS JOIN LATERAL (
    SELECT (array_agg(raw_output ORDER BY attempt DESC, id DESC))[1] AS plan, bool_or(valid) AS parsed
    FROM {decision} WHERE run_id = r.run_id AND depth = 0
) AS d
ORDER BY r.item, r.run_id
"""
ITEM, RUN_ID, SCORE, TASK_ID, COST, PLAN, PARSED = range(7)  # a row's columns
REFERENCE = 2  # a task's reference, in its columns after the id
# The columns of the rows' tasks that the build needs, by task id (as text).
_TASKS = """
SELECT id::text, text, domain, reference, scorer, classification, max_steps, max_depth
FROM {task} WHERE id = ANY(%s::uuid[])
"""


def _chunks(
    rollouts: QuerySet[Rollout],
) -> Generator[tuple[list[tuple[Any, ...]], dict[str, tuple[Any, ...]]], None, None]:
    """The rows of `_ROWS` FETCH at a time through a server-side cursor (plain SQL: no ORM converters
    per row): item, run id, score, task id (text), cost (text), plan (JSON bytes), parsed;
    each time with their tasks' columns (text, domain, reference, scorer, classification, max_steps,
    max_depth) by task id. A thread reads the next rows and their tasks while these are used:
    PostgreSQL finds them while Python works (psycopg waits for the server without the GIL), and
    nothing else uses the connection until the last rows are read (the tasks come in a query of their
    own, a few hundred for thousands of rows, rather than with each row: hundreds of bytes each)."""
    selected = rollouts.order_by().annotate(
        task_text=Cast("task_id", TextField()),
        cost_text=Cast("run__cost_usd", TextField()),
    )
    inner, params = selected.values_list(
        "item", "run_id", "score_used", "task_text", "cost_text"
    ).query.sql_with_params()
    tasks_sql = _TASKS.format(task=Task._meta.db_table)
    # Both made here, used by the thread below through Django's wrappers (its errors, its query log).
    rows_cursor, tasks_cursor = connection.chunked_cursor(), connection.cursor()
    try:
        rows_cursor.cursor.adapters.register_loader("json", PlanBytes)
        rows_cursor.execute(_ROWS.format(rollouts=inner, decision=Decision._meta.db_table), params)

        def read() -> tuple[list[tuple[Any, ...]], dict[str, tuple[Any, ...]]]:
            rows = rows_cursor.fetchmany(FETCH)
            if not rows:
                return rows, {}
            tasks_cursor.execute(tasks_sql, [list({row[TASK_ID] for row in rows})])
            return rows, {task[0]: task[1:] for task in tasks_cursor.fetchall()}

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataset-rows") as reader:
            ahead = reader.submit(read)
            while (chunk := ahead.result())[0]:
                ahead = reader.submit(read)
                yield chunk
    finally:
        rows_cursor.close()
        tasks_cursor.close()


class _GroupWriter:
    """The groups of one build as they stream past: each rewarded (rewards and advantages computed once
    per distinct input, up to MEMO of each kept), and those of at least `min_group_size` handed to the
    files `files.batch` at a time."""

    def __init__(self, files: GroupFiles, config: RewardConfig, *, min_group_size: int, validation: float):
        self.files = files
        self.config = config
        self.min_group_size = min_group_size
        self.validation = validation
        self.built = Built()
        self.prompts = Prompts()
        self.rewards: dict[tuple[Any, ...], tuple[float, str]] = {}
        self.advantages: dict[tuple[float, ...], list[float]] = {}
        self.tasks: dict[str, tuple[Any, ...]] = {}  # the columns of the tasks of the rows at hand, by id
        self.kept: list[tuple[list[tuple[Any, ...]], list[tuple[float, str]], tuple[Any, ...]]] = []

    def tasks_keep(self, chunk_tasks: dict[str, tuple[Any, ...]], members: list[tuple[Any, ...]]) -> None:
        """These rows' tasks, and those of the group still open (its first rows came before): no more."""
        carried = {row[TASK_ID]: self.tasks[row[TASK_ID]] for row in members}
        self.tasks.clear()
        self.tasks.update(carried)
        self.tasks.update(chunk_tasks)

    def group(self, members: list[tuple[Any, ...]]) -> None:
        """One item's rows: its graded samples rewarded, kept when there are enough of them."""
        samples, earned = [], []
        for row in members:
            correct, cost, parsed = row[SCORE], row[COST], row[PARSED]
            # a reference to grade against: NULL (none) and "" are not
            if parsed and correct is None and self.tasks[row[TASK_ID]][REFERENCE]:
                self.built.ungraded += (
                    1  # the plan ran but nothing graded it (a failed call, no judge): no reward
                )
                continue
            samples.append(row)
            earned.append(self._reward(parsed, correct, cost))
        if not samples:
            return
        self.built.groups += 1
        if len(samples) >= self.min_group_size:
            # the group's task: its first sample's
            self.kept.append((samples, earned, self.tasks[samples[0][TASK_ID]]))
        if len(self.kept) >= self.files.batch:
            self.write()

    def _reward(self, parsed: bool, correct: float | None, cost: str) -> tuple[float, str]:
        key = (parsed, correct, cost)
        if key not in self.rewards:
            if len(self.rewards) >= MEMO:
                self.rewards.clear()
            reward = reward_of(parsed=parsed, correct=correct, cost_usd=Decimal(cost), config=self.config)
            self.rewards[key] = (reward.reward, str(reward.cost_usd))
        return self.rewards[key]

    def _advantages(self, values: tuple[float, ...]) -> list[float]:
        if values not in self.advantages:
            if len(self.advantages) >= MEMO:
                self.advantages.clear()
            self.advantages[values] = group_advantages(list(values))
        return self.advantages[values]

    def write(self) -> None:
        """The kept groups to the files, counted."""
        for samples, earned, task in self.kept:
            text, domain, reference, scorer, classification, max_steps, max_depth = task
            item = samples[0][ITEM]
            values = tuple(reward for reward, _ in earned)
            ids = [row[RUN_ID] for row in samples]
            self.built.kept += 1
            spread = max(values) - min(values)
            self.built.with_signal += spread > 1e-9
            self.built.spread_sum += spread
            self.built.run_ids += ids
            prompt = self.prompts.of(
                text,
                item=item,
                domain=domain,
                classification=classification,
                max_steps=max_steps,
                max_depth=max_depth,
            )
            self.files.add(
                split_of(item, self.validation),
                Group(
                    prompt_json=prompt,
                    task={
                        "item": item,
                        "task_id": samples[0][TASK_ID],
                        "domain": domain,
                        "reference": reference,
                        "scorer": scorer,
                    },
                    completions_json=[row[PLAN] for row in samples],
                    samples={
                        "rewards": list(values),
                        "advantages": self._advantages(values),
                        "scores": [row[SCORE] for row in samples],
                        "parsed": [row[PARSED] for row in samples],
                        "costs_usd": [cost for _, cost in earned],
                        "run_ids": ids,
                    },
                ),
            )
        self.kept.clear()


def groups_stream(
    rollouts: QuerySet[Rollout],
    files: GroupFiles,
    config: RewardConfig,
    *,
    min_group_size: int,
    validation: float,
) -> Built:
    """One pass over the rollouts in item order: each item's samples are a group, rewarded as soon as
    the next item begins, and written `files.batch` groups at a time."""
    writer = _GroupWriter(files, config, min_group_size=min_group_size, validation=validation)
    members: list[tuple[Any, ...]] = []
    # closed on the way out, whatever happens: its thread stops reading before the transaction ends
    with closing(_chunks(rollouts)) as chunks:
        for rows, chunk_tasks in chunks:
            writer.tasks_keep(chunk_tasks, members)
            for row in rows:
                if members and row[ITEM] != members[0][ITEM]:
                    writer.group(members)
                    members = []
                members.append(row)
    if members:
        writer.group(members)
    if writer.kept:
        writer.write()
    return writer.built
