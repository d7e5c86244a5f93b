"""A task and its runs: each run's decisions, steps, attempts and reviewers' verdicts.

Every total on a Step, Run or Task is the exact sum of the rows beneath it, written by the engine in
the same transaction as the row that changed it.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models

from .money import USD, ZERO
from .pool import ConductorVersion, DataClass, Worker


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


RUN_ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED)  # a run in either will not change again


class StopReason(models.TextChoices):
    """Why a run failed (Run.stop_reason): the run-level error kinds, beside a provider call's."""

    STEP_FAILED = "step_failed", "A step's calls failed"
    NO_RECORDED_ANSWER = "no_recorded_answer", "No recorded answer"
    KEY_NOT_ALLOWED = "key_not_allowed", "Key not allowed"
    POLICY_BLOCKED = "policy_blocked", "Blocked by a data policy"
    COST_BUDGET = "cost_budget", "Cost budget reached"
    STEP_BUDGET = "step_budget", "Step budget reached"
    INVALID_PLAN = "invalid_plan", "Invalid plan"
    CONDUCTOR_UNAVAILABLE = "conductor_unavailable", "Conductor unavailable"
    NO_WORKERS = "no_workers", "No enabled worker"
    UNKNOWN_WORKER = "unknown_worker", "Unknown worker"
    INTERNAL = "internal", "Internal error"


class Task(models.Model):
    class Source(models.TextChoices):
        API = "api", "REST API"
        WEB = "web", "Web form"
        CLI = "cli", "Command line"
        TRAINING = "training", "Training (rollouts, evaluations)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    text = models.TextField()
    reference = models.TextField(blank=True, null=True)  # noqa: DJ001 - None means "no reference", unlike ""
    scorer = models.CharField(max_length=20, default="auto")
    domain = models.CharField(max_length=40, blank=True)
    source_item = models.CharField(
        max_length=200,
        blank=True,
        help_text="Benchmark item id, when the task comes from a recorded data set",
    )
    classification = models.CharField(max_length=20, choices=DataClass.choices, default=DataClass.INTERNAL)
    max_steps = models.PositiveIntegerField()
    max_depth = models.PositiveIntegerField()
    max_usd = models.DecimalField(**USD)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    source = models.CharField(max_length=10, choices=Source.choices)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    final_answer = models.TextField(blank=True)
    score = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    cost_usd = models.DecimalField(**USD, default=ZERO)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(
        null=True, blank=True, help_text="Content deleted under the retention policy"
    )
    # Full-text search over the task text (the task list's search box), computed by PostgreSQL and
    # stored, so that matching a row never re-parses its text.
    search_vector = models.GeneratedField(
        expression=SearchVector("text", config="english"), output_field=SearchVectorField(), db_persist=True
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="task_status_created"),
            models.Index(fields=["finished_at"], name="task_finished"),  # the live overview's window
            GinIndex(fields=["search_vector"], name="task_text_search"),
        ]

    def __str__(self) -> str:
        return f"Task {self.id}"

    @property
    def latency_s(self) -> float | None:
        """Submission to the end of its live runs (the latency its submitter saw)."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.created_at).total_seconds()


class Run(models.Model):
    """One execution of a task's workflow. A task has the live run and may have retries,
    shadow runs and rollouts."""

    class Kind(models.TextChoices):
        LIVE = "live", "Live"
        RETRY = "retry", "Retry"
        SHADOW = "shadow", "Shadow"
        ROLLOUT = "rollout", "Rollout"
        EVALUATION = "evaluation", "Evaluation"
        PLAYGROUND = "playground", "Playground"  # a user's variation, beside the task's own runs

    # Indexed by run_task_created (task, newest first): no index of its own.
    task = models.ForeignKey(Task, related_name="runs", on_delete=models.PROTECT, db_index=False)
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.LIVE)
    temperature = models.FloatField(
        null=True,
        blank=True,
        help_text="Sampling temperature for the conductor (rollouts); none: its default",
    )
    plan_override = models.TextField(
        blank=True,
        help_text="A plan written elsewhere (a trainer's sample) executed instead of asking the conductor",
    )
    conductor_version = models.ForeignKey(ConductorVersion, related_name="runs", on_delete=models.PROTECT)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    correlation_id = models.UUIDField(default=uuid.uuid4, editable=False, unique=True)
    deliveries = models.PositiveIntegerField(
        default=0, help_text="How many times a worker process took this run"
    )
    worker_host = models.CharField(max_length=200, blank=True)
    worker_pid = models.PositiveIntegerField(null=True, blank=True)
    # The pid of the worker process that owns worker_pid (a Celery worker's main process): while it
    # lives it holds its presence lock (routing.presence), and it sends the run again itself.
    worker_ppid = models.PositiveIntegerField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    claim_epoch = models.PositiveBigIntegerField(
        default=0,
        help_text="Fencing token: raised by each claim; a process's writes hold only while it is current",
    )
    enqueued_at = models.DateTimeField(
        null=True, blank=True, help_text="When a message for this run was last handed to the broker"
    )
    final_answer = models.TextField(blank=True)
    score = models.FloatField(null=True, blank=True)
    stop_reason = models.CharField(max_length=40, blank=True)
    error = models.TextField(blank=True)
    cost_usd = models.DecimalField(**USD, default=ZERO)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "heartbeat_at"], name="run_status_heartbeat"),
            models.Index(fields=["task", "-created_at"], name="run_task_created"),
            models.Index(fields=["finished_at"], name="run_finished"),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} of {self.task_id}"

    @property
    def latency_s(self) -> float | None:
        """Creation (the task's submission, for its live run) to the end: queueing included."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.created_at).total_seconds()

    @property
    def queued_s(self) -> float | None:
        """Creation to the first worker's claim: time spent waiting in the queue."""
        if self.started_at is None:
            return None
        return (self.started_at - self.created_at).total_seconds()

    @property
    def ran_s(self) -> float | None:
        """The first claim to the end: the run's own time (a redelivery's included)."""
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class Decision(models.Model):
    """One call to a conductor: what it was asked, what it answered, and whether that parsed."""

    # Indexed by decision_run_parent (run, parent step): no index of its own.
    run = models.ForeignKey(Run, related_name="decisions", on_delete=models.PROTECT, db_index=False)
    parent_step = models.ForeignKey(
        "Step", null=True, blank=True, related_name="child_decisions", on_delete=models.PROTECT
    )
    depth = models.PositiveIntegerField(default=0)
    attempt = models.PositiveIntegerField(default=1, help_text="1, or 2 when the first plan was invalid")
    backend = models.CharField(max_length=20)
    version_name = models.CharField(max_length=80)
    prompt = models.JSONField(default=list, help_text="The messages the conductor was given")
    raw_output = models.TextField(blank=True)
    plan = models.JSONField(null=True, blank=True, help_text="The validated plan; null when invalid")
    valid = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    alternatives = models.JSONField(default=list, blank=True)
    policy_checks = models.JSONField(
        default=dict, blank=True, help_text="Workers withheld and each step's verdict"
    )
    blocked_by = models.CharField(
        max_length=80, blank=True, help_text="The policy rule that blocked this plan"
    )
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(**USD, default=ZERO)
    latency_ms = models.FloatField(
        default=0.0,
        help_text="Milliseconds the plan took, to the microsecond (building its conductor included)",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "depth", "id"]
        indexes = [models.Index(fields=["run", "parent_step"], name="decision_run_parent")]

    def __str__(self) -> str:
        return f"Decision {self.pk} (run {self.run_id}, depth {self.depth}, try {self.attempt})"


class StepStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"


class Step(models.Model):
    """One subtask of a plan: which worker, what instruction, which earlier steps it may see."""

    # run, decision and worker are indexed by step_run_status, step_unique_index and
    # step_worker_finished (each leads with it): no index of their own, three fewer on every insert.
    run = models.ForeignKey(Run, related_name="steps", on_delete=models.PROTECT, db_index=False)
    decision = models.ForeignKey(Decision, related_name="steps", on_delete=models.PROTECT, db_index=False)
    index = models.PositiveSmallIntegerField()
    depth = models.PositiveIntegerField(default=0)
    worker = models.ForeignKey(
        Worker, null=True, blank=True, related_name="steps", on_delete=models.PROTECT, db_index=False
    )
    worker_slug = models.CharField(max_length=80, help_text="Copied so the record outlives the worker")
    vendor = models.CharField(max_length=80, blank=True)
    instruction = models.TextField()
    access = models.JSONField(default=list, help_text='"all", or the indices of earlier steps it may see')
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    messages_sent = models.JSONField(null=True, blank=True, help_text="Exactly what the worker received")
    response = models.TextField(blank=True)
    note = models.TextField(blank=True)
    error = models.TextField(blank=True)
    cost_usd = models.DecimalField(**USD, default=ZERO)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "depth", "decision_id", "index"]
        constraints = [models.UniqueConstraint(fields=["decision", "index"], name="step_unique_index")]
        indexes = [
            models.Index(fields=["run", "status"], name="step_run_status"),
            models.Index(fields=["worker", "finished_at"], name="step_worker_finished"),
        ]

    def __str__(self) -> str:
        return f"Step {self.index} ({self.worker_slug}) of run {self.run_id}"

    @property
    def is_conductor(self) -> bool:
        return self.worker_slug == CONDUCTOR_SLUG


CONDUCTOR_SLUG = "conductor"


class Annotation(models.Model):
    """A reviewer's verdict on a run's answer, or on one of its steps: correct or wrong, with a short
    label and a comment. Appended, never changed: a reviewer who changes their mind adds another (the
    newest counts, review.annotations.services). Recorded as `annotation.added`, which binds its values."""

    class Verdict(models.TextChoices):
        CORRECT = "correct", "Correct"
        WRONG = "wrong", "Wrong"

    run = models.ForeignKey(Run, related_name="annotations", on_delete=models.PROTECT, db_index=False)
    step = models.ForeignKey(
        "Step", null=True, blank=True, related_name="annotations", on_delete=models.PROTECT
    )
    verdict = models.CharField(max_length=10, choices=Verdict.choices)
    label = models.CharField(max_length=60, blank=True, help_text="A short tag, e.g. arithmetic or format")
    comment = models.TextField(blank=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    author_name = models.CharField(max_length=150, help_text="Copied so the record outlives the account")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["run", "-id"], name="annotation_run_newest")]

    def __str__(self) -> str:
        return f"Annotation {self.pk} ({self.verdict}, run {self.run_id})"


class Attempt(models.Model):
    """One provider call. Failed calls are kept: they can cost money and explain latency."""

    class Status(models.TextChoices):
        STARTED = "started", "Started"
        SUCCEEDED = "succeeded", "Succeeded"
        TIMEOUT = "timeout", "Timed out"
        RATE_LIMITED = "rate_limited", "Rate limited (429)"
        SERVER_ERROR = "server_error", "Provider error (5xx)"
        CLIENT_ERROR = "client_error", "Rejected (4xx)"
        MALFORMED = "malformed", "Malformed answer"
        ERROR = "error", "Error"
        LOST = "lost", "Worker process lost during the call"
        # The replay pool has no recorded answer: the data's gap, never a vendor's error (not in ERRORS).
        NO_RECORDING = "no_recording", "No recorded answer (replay pool)"

    # Every outcome but success and a call still in flight: the calls that failed, by kind.
    ERRORS = (
        Status.TIMEOUT,
        Status.RATE_LIMITED,
        Status.SERVER_ERROR,
        Status.CLIENT_ERROR,
        Status.MALFORMED,
        Status.ERROR,
        Status.LOST,
    )

    # Indexed by attempt_unique_number (step, number): no index of its own.
    step = models.ForeignKey(Step, related_name="attempts", on_delete=models.PROTECT, db_index=False)
    number = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.STARTED)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(**USD, default=ZERO)
    cost_estimated = models.BooleanField(
        default=False, help_text="Cost and tokens are an estimate: the call's outcome is unknown (lost)"
    )
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    provider_request_id = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["step", "number"]
        constraints = [models.UniqueConstraint(fields=["step", "number"], name="attempt_unique_number")]
        indexes = [  # the live overview and the calls page: recent calls, and those in flight
            models.Index(fields=["started_at"], name="attempt_started"),
            models.Index(fields=["finished_at"], name="attempt_finished"),
            models.Index(fields=["status"], condition=models.Q(status="started"), name="attempt_in_flight"),
        ]

    def __str__(self) -> str:
        return f"Attempt {self.number} of step {self.step_id}: {self.status}"
