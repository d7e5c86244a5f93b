"""GRPO datasets built from finished rollouts: groups, rewards, advantages, files (Parquet and
JSON Lines) and their manifest.
"""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import threading
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, Max, OuterRef, QuerySet, TextField
from django.db.models.functions import Cast, Coalesce
from psycopg.adapt import Loader

from audit.actions import Action
from audit.services import Actor, event_record
from routing import review
from routing.conductors import LLMConductor
from routing.engine.planning import plan_request, screened_workers
from routing.limits import name_check
from routing.models import Annotation, ConductorVersion, Decision, Task

from ..models import Dataset, Rollout
from ..rewards import RewardConfig, group_advantages, reward_of
from .common import FINISHED_RUN, TrainingError, check_or_refuse, user_of

DATASET_LOCK_NAMESPACE = 0x44617461  # "Data": one build of a dataset name at a time


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


def _split_of(item: str, validation_fraction: float) -> str:
    bucket = int(hashlib.sha256(item.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "validation" if bucket < validation_fraction else "train"


@dataclass(frozen=True)
class DatasetFilter:
    batch_ids: list[int] | None = None
    conductor_version: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    items: list[str] | None = None
    min_group_size: int = 2

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_ids": self.batch_ids,
            "conductor_version": self.conductor_version,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "items": self.items,
            "min_group_size": self.min_group_size,
        }


def dataset_build(
    *,
    name: str,
    batch_ids: list[int] | None = None,
    conductor_version: ConductorVersion | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    items: list[str] | None = None,
    min_group_size: int = 2,
    reward_config: RewardConfig | None = None,
    validation_fraction: float = 0.1,
    actor: Actor,
    user: Any = None,
) -> Dataset:
    """A new version of dataset `name` from the finished rollouts that match the filter.

    One row per group (an item): the conductor's prompt (TRL's `prompt` column, conversational), the
    group's completions (`group_completions`: the plans as written; TRL passes its own `completions` to
    reward functions), their rewards and group-relative advantages, and what the reward functions need
    (item, reference, domain, scorer). Files: train/validation as Parquet and
    JSON Lines, and manifest.json (filter, counts, content hash, source run ids).
    """
    check_or_refuse(name_check, name)  # routing.limits.NAME_PATTERN: ASCII only, no look-alikes
    if min_group_size < 1:
        raise TrainingError("the minimum group size is at least 1")
    if not 0 <= validation_fraction < 1:
        raise TrainingError("the validation fraction is between 0 and 1")
    if since and until and since >= until:
        raise TrainingError("the period is empty: 'since' is not before 'until'")
    reward_config = reward_config or RewardConfig()
    selection = DatasetFilter(
        batch_ids=batch_ids,
        conductor_version=conductor_version.name if conductor_version else None,
        since=since,
        until=until,
        items=items,
        min_group_size=min_group_size,
    )
    rollouts = Rollout.objects.filter(run__status__in=FINISHED_RUN).select_related("run", "task")
    if batch_ids:
        rollouts = rollouts.filter(batch_id__in=batch_ids)
    if conductor_version is not None:
        # A trainer's samples are the plans of the model being trained, whatever version ran them.
        rollouts = rollouts.filter(run__conductor_version=conductor_version, batch__training_job__isnull=True)
    if since:
        rollouts = rollouts.filter(run__created_at__gte=since)
    if until:
        rollouts = rollouts.filter(run__created_at__lt=until)
    if items:
        rollouts = rollouts.filter(item__in=items)
    # The correctness each sample is rewarded for: its score, or a reviewer's verdict where there is one.
    human = review.human_score(run=OuterRef("run_id"))
    human_labelled = Annotation.objects.filter(run=OuterRef("run_id"), step__isnull=True)
    rollouts = rollouts.annotate(
        score_used=Coalesce(human, F("run__score")) if reward_config.human_labels else F("run__score")
    )
    with transaction.atomic():
        # One build of a name at a time: the next version number is read under this lock.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [DATASET_LOCK_NAMESPACE, name])
        version = (Dataset.objects.filter(name=name).aggregate(v=Max("version"))["v"] or 0) + 1
        relative = Path("datasets") / name / f"v{version}"
        directory = settings.VAR_DIR / relative
        if directory.exists():
            raise TrainingError(f"{relative} exists but no dataset names it; move it away first")
        try:
            with _collector_paused(), _Files(directory) as files:
                built = _stream_groups(
                    rollouts,
                    files,
                    reward_config,
                    min_group_size=min_group_size,
                    validation=validation_fraction,
                )
            if not built.kept:
                raise TrainingError(
                    f"no group of at least {min_group_size} finished rollouts matches the filter "
                    f"({built.groups} smaller groups, {built.ungraded} ungraded samples left out)"
                )
            counts = {
                "groups": built.kept,
                # A group whose samples all earned the same reward has advantage 0 everywhere: GRPO
                # learns nothing from it. How many can teach, and how far rewards spread within a group.
                "groups_with_signal": built.with_signal,
                "reward_spread_mean": round(built.spread_sum / built.kept, 6),
                "train": files.rows["train"],
                "validation": files.rows["validation"],
                "completions": len(built.run_ids),
                "skipped_groups": built.groups - built.kept,
                "ungraded_samples": built.ungraded,
            }
            if reward_config.human_labels:
                counts["human_labels"] = rollouts.filter(Exists(human_labelled)).count()
            dataset = Dataset.objects.create(
                name=name,
                version=version,
                filter=selection.as_dict(),
                reward_config=reward_config.as_dict(),
                counts=counts,
                content_hash=files.content_hash(),
                path=str(relative),
                created_by=user_of(user),
            )
            dataset.source_run_ids = _source_runs_save(dataset, built.run_ids)
            (directory / "manifest.json").write_text(json.dumps(_manifest(dataset), indent=2, default=str))
            event_record(
                actor=actor,
                action=Action.DATASET_BUILT,
                obj=dataset,
                payload={
                    "name": name,
                    "version": version,
                    "filter": selection.as_dict(),
                    "reward_config": reward_config.as_dict(),
                    "counts": counts,
                    "content_hash": dataset.content_hash,
                    "source_runs": len(built.run_ids),
                },
            )
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)  # this build made it: nothing half-written stays
            raise
    return dataset


def _source_runs_save(dataset: Dataset, run_ids: list[int]) -> list[int]:
    """Store the dataset's run ids, sorted, as one array literal (a build may have hundreds of
    thousands: the ORM would prepare each id on its own)."""
    ordered = sorted(run_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE training_dataset SET source_run_ids = %s::bigint[] WHERE id = %s",
            ["{" + ",".join(map(str, ordered)) + "}", dataset.pk],
        )
    return ordered


class _Paused:
    """Builds under way in this process, and whether the collector ran before the first began."""

    lock = threading.Lock()
    builds = 0
    was_enabled = True


@contextmanager
def _collector_paused() -> Iterator[None]:
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


BATCH = 250  # groups per write (a group is some 20 KB of JSON with 8 samples): memory stays flat
FETCH = 2000  # rollout rows per round trip (some 3 MB of plans; the next read while these are used)
MEMO = 4096  # rewards (and advantages) kept for reuse; costs vary by run, so this is bounded too


@dataclass
class _Built:
    groups: int = 0  # items with at least one graded sample
    kept: int = 0  # of those, with at least min_group_size
    ungraded: int = 0
    with_signal: int = 0
    spread_sum: float = 0.0
    run_ids: list[int] = field(default_factory=list)


_json = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(x, ensure_ascii=False), one encoder


class _Prompts:
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
            return _json(conductor_prompt(Task(text=text, source_item=item, **shape), self._pools))
        head, tail = template
        return head + _json(text)[1:-1] + tail

    def _template(self, *, item: str, **shape: Any) -> tuple[str, str] | None:
        """The messages' JSON before and after the text's place. A JSON string escapes each character
        on its own, so the text's JSON (without its quotes) put there gives the JSON of the messages with
        the text in its place, if the prompt holds the text once, as it is, and nothing else of it: a
        second text, longer and with escapes, must come out of the template as the prompt writes it."""
        encoded = _json(conductor_prompt(Task(text=self.MARK, source_item=item, **shape), self._pools))
        marker = _json(self.MARK)[1:-1]
        if encoded.count(marker) != 1:
            return None  # the text is placed more than once, or changed on its way
        head, tail = encoded.split(marker)
        probe = conductor_prompt(Task(text=self.PROBE, source_item=item, **shape), self._pools)
        if head + _json(self.PROBE)[1:-1] + tail != _json(probe):
            return None  # the prompt depends on the text some other way (its length, a copy changed)
        return head, tail


class _PlanBytes(Loader):
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
        rows_cursor.cursor.adapters.register_loader("json", _PlanBytes)
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


def _stream_groups(
    rollouts: QuerySet[Rollout],
    files: _Files,
    config: RewardConfig,
    *,
    min_group_size: int,
    validation: float,
) -> _Built:
    """One pass over the rollouts in item order: each item's samples are a group, rewarded as soon as
    the next item begins, and written BATCH groups at a time. Rewards and advantages are computed once
    per distinct input."""
    built = _Built()
    prompts = _Prompts()
    rewards: dict[tuple[Any, ...], tuple[float, str]] = {}
    advantages: dict[tuple[float, ...], list[float]] = {}
    tasks: dict[str, tuple[Any, ...]] = {}  # the columns of the tasks of the rows at hand, by id
    kept: list[tuple[list[tuple[Any, ...]], list[tuple[float, str]], tuple[Any, ...]]] = []

    def group(members: list[tuple[Any, ...]]) -> None:
        samples, earned = [], []
        for row in members:
            correct, cost, parsed = row[SCORE], row[COST], row[PARSED]
            # a reference to grade against: NULL (none) and "" are not
            if parsed and correct is None and tasks[row[TASK_ID]][REFERENCE]:
                built.ungraded += 1  # the plan ran but nothing graded it (a failed call, no judge): no reward
                continue
            key = (parsed, correct, cost)
            if key not in rewards:
                if len(rewards) >= MEMO:
                    rewards.clear()
                reward = reward_of(parsed=parsed, correct=correct, cost_usd=Decimal(cost), config=config)
                rewards[key] = (reward.reward, str(reward.cost_usd))
            samples.append(row)
            earned.append(rewards[key])
        if not samples:
            return
        built.groups += 1
        if len(samples) >= min_group_size:
            kept.append((samples, earned, tasks[samples[0][TASK_ID]]))  # the group's task: its first sample's
        if len(kept) >= BATCH:
            write()

    def write() -> None:
        for samples, earned, (text, domain, reference, scorer, classification, max_steps, max_depth) in kept:
            item = samples[0][ITEM]
            values = tuple(reward for reward, _ in earned)
            if values not in advantages:
                if len(advantages) >= MEMO:
                    advantages.clear()
                advantages[values] = group_advantages(list(values))
            ids = [row[RUN_ID] for row in samples]
            built.kept += 1
            spread = max(values) - min(values)
            built.with_signal += spread > 1e-9
            built.spread_sum += spread
            built.run_ids += ids
            prompt = prompts.of(
                text,
                item=item,
                domain=domain,
                classification=classification,
                max_steps=max_steps,
                max_depth=max_depth,
            )
            files.add(
                _split_of(item, validation),
                _Group(
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
                        "advantages": advantages[values],
                        "scores": [row[SCORE] for row in samples],
                        "parsed": [row[PARSED] for row in samples],
                        "costs_usd": [cost for _, cost in earned],
                        "run_ids": ids,
                    },
                ),
            )
        kept.clear()

    members: list[tuple[Any, ...]] = []
    # closed on the way out, whatever happens: its thread stops reading before the transaction ends
    with closing(_chunks(rollouts)) as chunks:
        for rows, chunk_tasks in chunks:
            # these rows' tasks, and those of the group still open (its first rows came before): no more
            carried = {row[TASK_ID]: tasks[row[TASK_ID]] for row in members}
            tasks.clear()
            tasks.update(carried)
            tasks.update(chunk_tasks)
            for row in rows:
                if members and row[ITEM] != members[0][ITEM]:
                    group(members)
                    members = []
                members.append(row)
    if members:
        group(members)
    if kept:
        write()
    return built


def _schema() -> Any:
    """The files' columns (TRL conversational: `prompt` is a list of messages)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("item", pa.string()),
            ("task_id", pa.string()),
            ("domain", pa.string()),
            ("reference", pa.string()),
            ("scorer", pa.string()),
            ("group_completions", pa.list_(pa.string())),
            ("rewards", pa.list_(pa.float64())),
            ("advantages", pa.list_(pa.float64())),
            ("scores", pa.list_(pa.float64())),
            ("parsed", pa.list_(pa.bool_())),
            ("costs_usd", pa.list_(pa.string())),
            ("run_ids", pa.list_(pa.int64())),
        ]
    )


@dataclass
class _Group:
    """One row of the files, its columns in order: the prompt's JSON (see _Prompts), the task's
    columns, the plans (`group_completions`) each as a JSON string in UTF-8 (see _PlanBytes), and the
    samples' columns."""

    prompt_json: str
    task: dict[str, Any]
    completions_json: list[bytes]
    samples: dict[str, Any]

    def line(self) -> list[bytes]:
        """The JSON line in UTF-8, as json.dumps writes the row (ensure_ascii=False), in parts: the
        batch's lines are joined in one go (each plan copied once)."""
        parts = [f'{{"prompt": {self.prompt_json}, {_json(self.task)[1:-1]}, "group_completions": ['.encode()]
        for plan in self.completions_json:
            parts += (plan, b", ")
        if self.completions_json:
            parts.pop()  # no comma after the last
        parts.append(f"], {_json(self.samples)[1:]}\n".encode())
        return parts


class _Files:
    """train/validation as Parquet and JSON Lines, written BATCH groups at a time by one writer thread
    (while the build reads the next rows: the writes, hashing, JSON parsing and Parquet encoding leave
    the GIL; one batch is written while the next fills, so memory stays at two batches). The JSON Lines
    are hashed as they are written, and parsed by Arrow into the Parquet rows."""

    SPLITS = ("train", "validation")

    def __init__(self, directory: Path):
        self.directory = directory
        self.rows = dict.fromkeys(self.SPLITS, 0)
        self._pending: dict[str, list[_Group]] = {split: [] for split in self.SPLITS}
        self._digest = hashlib.sha256()  # of train.jsonl; validation.jsonl is read back at the end
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataset-files")
        self._writing: Future[None] | None = None

    def __enter__(self) -> _Files:
        import pyarrow.parquet as pq

        self.directory.mkdir(parents=True, exist_ok=True)
        self._schema = _schema()
        self._parquet = {
            s: pq.ParquetWriter(self.directory / f"{s}.parquet", self._schema) for s in self.SPLITS
        }
        self._jsonl = {s: (self.directory / f"{s}.jsonl").open("wb") for s in self.SPLITS}
        return self

    def add(self, split: str, group: _Group) -> None:
        self._pending[split].append(group)
        self.rows[split] += 1
        if len(self._pending[split]) >= BATCH:
            self._write(split)

    def _write(self, split: str) -> None:
        groups, self._pending[split] = self._pending[split], []
        if not groups:
            return
        self._wait()
        self._writing = self._writer.submit(self._write_groups, split, groups)

    def _wait(self) -> None:
        """The batch being written is written (its error raised here)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _write_groups(self, split: str, groups: list[_Group]) -> None:
        text = b"".join([part for group in groups for part in group.line()])
        self._jsonl[split].write(text)
        if split == self.SPLITS[0]:
            self._digest.update(text)
        self._parquet[split].write_table(self._parsed(text))

    def _parsed(self, text: bytes) -> Any:
        """The lines as an Arrow table, parsed by Arrow (no Python object per value, the GIL left):
        the Parquet rows are the JSON Lines' rows by construction."""
        import pyarrow as pa
        import pyarrow.json as pj

        return pj.read_json(
            pa.BufferReader(text),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(text) + 1),
            parse_options=pj.ParseOptions(explicit_schema=self._schema, unexpected_field_behavior="error"),
        )

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                for split in self.SPLITS:
                    self._write(split)
            self._wait()
        finally:
            self._writer.shutdown()
            for split in self.SPLITS:
                self._jsonl[split].close()
                self._parquet[split].close()

    def content_hash(self) -> str:
        """sha256 over train.jsonl, then validation.jsonl."""
        digest = self._digest.copy()
        for split in self.SPLITS[1:]:
            with (self.directory / f"{split}.jsonl").open("rb") as fh:
                while block := fh.read(1 << 20):
                    digest.update(block)
        return digest.hexdigest()


def _manifest(dataset: Dataset) -> dict[str, Any]:
    return {
        "name": dataset.name,
        "version": dataset.version,
        "created_at": dataset.created_at.isoformat(),
        "filter": dataset.filter,
        "reward_config": dataset.reward_config,
        "counts": dataset.counts,
        "content_hash": {
            "algorithm": "sha256",
            "over": ["train.jsonl", "validation.jsonl"],
            "value": dataset.content_hash,
        },
        "source_run_ids": dataset.source_run_ids,
        "files": sorted(DATASET_FILES),
        "format": "TRL conversational: 'prompt' is a list of messages; the other columns reach reward functions",
    }


DATASET_FILES = ("train.parquet", "validation.parquet", "train.jsonl", "validation.jsonl", "manifest.json")


def dataset_preview(dataset: Dataset, limit: int = 5) -> list[dict[str, Any]]:
    """The first groups of the training split, each sample with its reward and advantage."""
    path = dataset_files(dataset).get("train.jsonl")
    if path is None:
        return []
    groups: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if len(groups) >= limit:
                break
            row = json.loads(line)
            samples = zip(
                row["group_completions"], row["rewards"], row["advantages"], row["run_ids"], strict=True
            )
            groups.append(
                {
                    "item": row["item"],
                    "task_id": row["task_id"],
                    "domain": row["domain"],
                    "task": row["prompt"][-1]["content"] if row["prompt"] else "",
                    "samples": [
                        {"completion": c, "reward": r, "advantage": a, "run_id": run}
                        for c, r, a, run in samples
                    ],
                }
            )
    return groups


def dataset_files(dataset: Dataset) -> dict[str, Path]:
    directory = settings.VAR_DIR / dataset.path
    return {name: directory / name for name in DATASET_FILES if (directory / name).exists()}
