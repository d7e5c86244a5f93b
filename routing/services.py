"""Writes for the routing app: each is one transaction with its audit event; side effects on commit."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from audit.actions import Action
from audit.services import Actor, event_record
from routing.scoring.scorers import check_pattern

from . import limits
from .conductors import DEFAULT_STATIC_RULES
from .errors import ServiceError
from .hashing import content_hash
from .models import ConductorVersion, DataClass, Run, RunStatus, Task, Worker
from .providers import litellm_model_info
from .replay import ReplayItem
from .secrets import ENDPOINT_FIELDS, key_env_check
from .tasks import run_send


class SubmissionError(ServiceError):
    """The submission cannot be accepted; the message says why."""


class IdempotencyConflict(SubmissionError):
    """The idempotency key was used before for a different task."""

    status = 409


@dataclass(frozen=True)
class TaskSubmission:
    text: str
    reference: str | None = None
    classification: str = DataClass.INTERNAL
    max_steps: int | None = None
    max_depth: int | None = None
    max_usd: Decimal | None = None
    idempotency_key: str | None = None
    domain: str = ""
    source_item: str = ""
    scorer: str = "auto"

    @classmethod
    def of_replay(cls, item: ReplayItem, *, idempotency_key: str) -> TaskSubmission:
        """A recorded benchmark item as a task (public data: the benchmarks are published)."""
        return cls(
            text=item.task,
            reference=item.reference,
            domain=item.domain,
            source_item=item.id,
            classification=DataClass.PUBLIC,
            idempotency_key=idempotency_key,
        )


def _check_text(text: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise SubmissionError("the task text is empty")
    if "\x00" in text:
        raise SubmissionError("the task text contains a NUL character, which cannot be stored")
    try:
        limits.text_length_check(text)
    except ValidationError as exc:
        raise SubmissionError(" ".join(exc.messages)) from exc
    return text


def _check_budgets(submission: TaskSubmission) -> None:
    # The form and the serializer check these first; this covers the CLI and other callers.
    try:
        limits.budgets_check(
            max_steps=submission.max_steps, max_depth=submission.max_depth, max_usd=submission.max_usd
        )
    except ValidationError as exc:
        raise SubmissionError(
            "; ".join(f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items())
        ) from exc


def conductor_active() -> ConductorVersion:
    """The active conductor version; the static baseline is created and activated on first use."""
    active = ConductorVersion.objects.filter(is_active=True).first()
    if active is not None:
        return active
    with transaction.atomic():
        version, created = ConductorVersion.objects.get_or_create(
            name="static-v1",
            defaults={
                "backend": ConductorVersion.Backend.STATIC,
                "config": DEFAULT_STATIC_RULES,
                "is_active": True,
            },
        )
        if created:
            event_record(
                actor=Actor.service("setup"),
                action=Action.CONDUCTOR_ACTIVATED,
                obj=version,
                payload={"name": version.name, "backend": version.backend, "reason": "no active conductor"},
            )
    return ConductorVersion.objects.get(is_active=True)


def conductor_activate(*, version: ConductorVersion, actor: Actor) -> ConductorVersion:
    with transaction.atomic():
        previous = ConductorVersion.objects.select_for_update().filter(is_active=True).first()
        if previous is not None and previous.pk != version.pk:
            ConductorVersion.objects.filter(pk=previous.pk).update(is_active=False)
        ConductorVersion.objects.filter(pk=version.pk).update(is_active=True)
        event_record(
            actor=actor,
            action=Action.CONDUCTOR_ACTIVATED,
            obj=version,
            payload={
                "name": version.name,
                "backend": version.backend,
                "previous": previous.name if previous else None,
            },
        )
    version.refresh_from_db()
    return version


# Idempotency-key prefixes that apps above routing use for tasks of their own: {prefix: whose}.
_RESERVED_KEY_PREFIXES: dict[str, str] = {}


def key_prefix_reserve(prefix: str, owner: str) -> None:
    """Refuse submissions whose idempotency key starts with `prefix` (tasks `owner` creates itself)."""
    _RESERVED_KEY_PREFIXES[prefix] = owner


def task_submit(*, submission: TaskSubmission, source: str, user: Any = None) -> tuple[Task, bool]:
    """Store a task and its live run, then queue the run. Returns (task, created).

    The same idempotency key gives back the task it first created; with a different text it is refused.
    """
    text, max_usd, key = _submission_checked(submission)
    if key is not None:
        existing = Task.objects.filter(idempotency_key=key).first()
        if existing is not None:
            return _same_or_conflict(existing, text), False
    conductor = conductor_active()
    actor = Actor.for_user(user) if user is not None else Actor.service(f"{source}-submit")
    try:
        with transaction.atomic():
            task = Task.objects.create(
                text=text,
                reference=submission.reference,
                scorer=submission.scorer,
                domain=submission.domain,
                source_item=submission.source_item,
                classification=submission.classification,
                max_steps=submission.max_steps or settings.CONDUCTOR_DEFAULT_MAX_STEPS,
                max_depth=settings.CONDUCTOR_DEFAULT_MAX_DEPTH
                if submission.max_depth is None
                else submission.max_depth,
                max_usd=max_usd,
                idempotency_key=key,
                source=source,
                submitted_by=user if getattr(user, "is_authenticated", False) else None,
            )
            run = Run.objects.create(task=task, conductor_version=conductor)
            shadow = ConductorVersion.objects.filter(is_shadow=True).exclude(pk=conductor.pk).first()
            shadow_run = (
                Run.objects.create(task=task, conductor_version=shadow, kind=Run.Kind.SHADOW)
                if shadow is not None
                else None
            )
            event_record(
                actor=actor,
                action=Action.TASK_SUBMITTED,
                obj=task,
                task_id=task.id,
                correlation_id=run.correlation_id,
                payload=_submitted_payload(task, run, shadow_run, source=source),
            )
            transaction.on_commit(lambda: run_enqueue(run_id=run.pk))
            if shadow_run is not None:
                transaction.on_commit(lambda: run_enqueue(run_id=shadow_run.pk))
    except IntegrityError:
        if key is None:
            raise
        # A concurrent request with the same key won the race: return its task.
        return _same_or_conflict(Task.objects.get(idempotency_key=key), text), False
    return task, True


def _submission_checked(submission: TaskSubmission) -> tuple[str, Decimal, str | None]:
    """The submission's text, cost budget and idempotency key, once every field passed its check
    (SubmissionError names the first that did not)."""
    text = _check_text(submission.text)
    if submission.classification not in DataClass.values:
        raise SubmissionError(
            f"unknown classification {submission.classification!r}; one of {DataClass.values}"
        )
    if submission.scorer == "regex" and submission.reference is not None:
        try:
            check_pattern(submission.reference)
        except ValueError as exc:
            raise SubmissionError(str(exc)) from exc
    max_usd = (
        settings.CONDUCTOR_DEFAULT_MAX_USD if submission.max_usd is None else Decimal(submission.max_usd)
    )
    if max_usd < 0:
        raise SubmissionError("max_usd must not be negative")
    _check_budgets(submission)
    key = submission.idempotency_key or None
    for prefix, owner in _RESERVED_KEY_PREFIXES.items():
        if key is not None and key.startswith(prefix):
            raise SubmissionError(f"idempotency keys starting with {prefix!r} are reserved for {owner}")
    return text, max_usd, key


def _submitted_payload(task: Task, run: Run, shadow_run: Run | None, *, source: str) -> dict[str, Any]:
    """The task.submitted event's payload: the task's shape and budgets, never its text."""
    return {
        "source": source,
        "classification": task.classification,
        "chars": len(task.text),
        "text_sha256": content_hash(task.text),
        "has_reference": task.reference is not None,
        "budgets": {
            "max_steps": task.max_steps,
            "max_depth": task.max_depth,
            "max_usd": task.max_usd,
        },
        "run_id": run.pk,
        "conductor": run.conductor_version.name,
        "shadow": {"run_id": shadow_run.pk, "conductor": shadow_run.conductor_version.name}
        if shadow_run
        else None,
    }


def task_retry(*, task_id: Any, user: Any) -> Run:
    """A new run of a failed task, with the active conductor (a `retry` run: it answers for the task as
    its live run did). The failed runs stay as they were: nothing of their record is lost. Refused for
    a task that has not failed, or whose content was deleted under the retention policy."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None:
            raise SubmissionError("no such task")
        if task.purged_at is not None:
            raise SubmissionError("its content was deleted under the retention policy: nothing to run")
        if task.status != RunStatus.FAILED:
            raise SubmissionError(f"only a failed task is retried; this one is {task.status}")
        conductor = conductor_active()
        run = Run.objects.create(task=task, conductor_version=conductor, kind=Run.Kind.RETRY)
        Task.objects.filter(pk=task.pk).update(status=RunStatus.QUEUED, finished_at=None)
        event_record(
            actor=Actor.for_user(user),
            action=Action.TASK_RETRIED,
            obj=task,
            task_id=task.id,
            correlation_id=run.correlation_id,
            payload={"run_id": run.pk, "conductor": conductor.name, "previous_error": task.error},
        )
        transaction.on_commit(lambda: run_enqueue(run_id=run.pk))
    return run


def _same_or_conflict(existing: Task, text: str) -> Task:
    if existing.text != text:
        raise IdempotencyConflict("this idempotency key was already used for a different task")
    return existing


def run_enqueue(*, run_id: int) -> None:
    """Hand a run's message to the broker (called on commit of the run). A broker that cannot be
    reached loses nothing: the run is committed, the caller gets its answer, and the sweep
    (routing.tasks.requeue_stalled_runs) sends the message once the broker is back."""

    run_send(run_id, previous=None)


def worker_upsert(*, slug: str, fields: dict[str, Any], actor: Actor) -> tuple[Worker, bool]:
    with transaction.atomic():
        worker, created = Worker.objects.select_for_update().get_or_create(slug=slug, defaults=fields)
        changed = {}
        if not created:
            for name, value in fields.items():
                if getattr(worker, name) != value:
                    changed[name] = {"from": getattr(worker, name), "to": value}
                    setattr(worker, name, value)
            if changed:
                worker.save()
        if created or changed:
            event_record(
                actor=actor,
                action=Action.WORKER_REGISTERED if created else Action.WORKER_UPDATED,
                obj=worker,
                payload={"slug": slug, "fields": fields if created else changed},
            )
        endpoint = {f: c for f, c in changed.items() if f in ENDPOINT_FIELDS}
        if endpoint:  # where data and which key go: its own event, easy to find in the log
            event_record(
                actor=actor,
                action=Action.WORKER_ENDPOINT_CHANGED,
                obj=worker,
                payload={"slug": slug, **endpoint},
            )
    return worker, created


def worker_register(
    *,
    slug: str,
    litellm_model: str,
    vendor: str,
    actor: Actor,
    api_base: str = "",
    api_key_env: str = "",
    input_usd_per_mtok: Decimal | None = None,
    output_usd_per_mtok: Decimal | None = None,
    context_window: int | None = None,
    data_classes: list[str] | None = None,
    self_hosted: bool = False,
    region: str = "",
    description: str = "",
) -> tuple[Worker, bool]:
    """Register (or update) a worker. Prices and context window come from litellm's local cost map
    unless given; a model the map does not know needs both prices."""

    info = litellm_model_info(litellm_model)
    if input_usd_per_mtok is not None and output_usd_per_mtok is not None:
        prices = (input_usd_per_mtok, output_usd_per_mtok)
        source = Worker.PriceSource.OVERRIDE
    elif info is not None and input_usd_per_mtok is None and output_usd_per_mtok is None:
        prices = (info.input_usd_per_mtok, info.output_usd_per_mtok)
        source = Worker.PriceSource.LITELLM
    else:
        raise SubmissionError(
            f"give both prices for {litellm_model}: "
            + ("litellm's cost map does not know it" if info is None else "one price alone is ambiguous")
        )
    try:
        key_env_check(api_key_env)
    except ValidationError as exc:
        raise SubmissionError(exc.messages[0]) from exc
    classes = data_classes or [DataClass.PUBLIC, DataClass.INTERNAL]
    unknown = set(classes) - set(DataClass.values)
    if unknown:
        raise SubmissionError(f"unknown data classes: {sorted(unknown)}")
    fields = {
        "display_name": slug,
        "litellm_model": litellm_model,
        "vendor": vendor,
        "api_base": api_base,
        "api_key_env": api_key_env,
        "input_usd_per_mtok": prices[0],
        "output_usd_per_mtok": prices[1],
        "price_source": source,
        "context_window": context_window or (info.context_window if info else None) or 128_000,
        "data_classes": classes,
        "self_hosted": self_hosted,
        "region": region,
        "description": description,
    }
    return worker_upsert(slug=slug, fields=fields, actor=actor)
