"""Training data: rollout batches (the GRPO groups), versioned datasets, training jobs and evaluations.

Runs themselves live in the routing app (tagged rollout / evaluation); the rows here say which runs
belong to which batch or evaluation, and what was built from them.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from routing.models import ConductorVersion, DataClass, Run, Task


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class RolloutBatch(models.Model):
    """K sampled workflows per item from one conductor version, run through the engine."""

    conductor_version = models.ForeignKey(
        ConductorVersion, related_name="rollout_batches", on_delete=models.PROTECT
    )
    k = models.PositiveIntegerField(help_text="Workflows sampled per item (the GRPO group size)")
    temperature = models.FloatField(default=1.0)
    items = models.JSONField(default=list, help_text="The source items (or task ids) rolled out")
    item_set = models.CharField(max_length=80, default="replay", help_text="The item set they come from")
    item_set_version = models.ForeignKey(
        "ItemSetVersion", null=True, blank=True, related_name="rollout_batches", on_delete=models.PROTECT
    )
    survey = models.BooleanField(
        default=False,
        help_text="Every worker answered each item once (the outcomes a learned policy trains on)",
    )
    status = models.CharField(max_length=20, choices=JobStatus.choices, default=JobStatus.QUEUED)
    training_job = models.ForeignKey(
        "TrainingJob",
        null=True,
        blank=True,
        related_name="sample_batches",
        on_delete=models.PROTECT,
        help_text="Set for the samples a trainer generated: plans of the model being trained",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, related_name="+", on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"Rollout batch {self.pk} ({self.conductor_version.name}, K={self.k})"


class Rollout(models.Model):
    """One sampled workflow of a group: the run that executed it."""

    batch = models.ForeignKey(RolloutBatch, related_name="rollouts", on_delete=models.PROTECT)
    task = models.ForeignKey(Task, related_name="rollouts", on_delete=models.PROTECT)
    run = models.OneToOneField(Run, related_name="rollout", on_delete=models.PROTECT)
    item = models.CharField(max_length=200, help_text="The group: the item this sample answers")
    sample = models.PositiveIntegerField()

    class Meta:
        ordering = ["batch", "item", "sample"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "item", "sample"], name="rollout_sample_once")
        ]

    def __str__(self) -> str:
        return f"Rollout {self.item} #{self.sample} (run {self.run_id})"


class Dataset(models.Model):
    """A versioned GRPO dataset built from rollouts: files under VAR_DIR/datasets/<name>/v<version>/."""

    name = models.SlugField(max_length=80)
    version = models.PositiveIntegerField()
    filter = models.JSONField(default=dict, help_text="What was selected: period, items, conductor version…")
    reward_config = models.JSONField(default=dict)
    counts = models.JSONField(default=dict)
    content_hash = models.CharField(
        max_length=64, help_text="SHA-256 of the JSON Lines files, in split order"
    )
    source_run_ids = ArrayField(models.BigIntegerField(), default=list)
    path = models.CharField(max_length=500, help_text="Directory of the files, relative to VAR_DIR")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, related_name="+", on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="dataset_name_version")]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def signal(self) -> str:
        """Whether it can teach: how many of its groups carry a learning signal (a reward that differs
        within the group; a group where every sample earned the same has advantage 0 and teaches GRPO
        nothing). Empty for a dataset built before this was counted."""
        counts = self.counts or {}
        if "groups_with_signal" not in counts:
            return ""
        return f"{counts['groups_with_signal']} of {counts.get('groups', 0)} groups carry a learning signal"

    @property
    def teaches_nothing(self) -> bool:
        return (self.counts or {}).get("groups_with_signal") == 0


class TrainingJob(models.Model):
    class Backend(models.TextChoices):
        LEARNED = "learned", "Learned policy (GRPO on the CPU)"
        LLM_LORA = "llm-lora", "LLM conductor (TRL GRPO + LoRA)"

    name = models.SlugField(
        max_length=80, unique=True, help_text="The candidate conductor version this job registers"
    )
    backend = models.CharField(max_length=20, choices=Backend.choices)
    dataset = models.ForeignKey(Dataset, null=True, blank=True, related_name="jobs", on_delete=models.PROTECT)
    options = models.JSONField(default=dict, blank=True, help_text="The backend's settings")
    status = models.CharField(max_length=20, choices=JobStatus.choices, default=JobStatus.QUEUED)
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    phase = models.CharField(
        max_length=200,
        blank=True,
        help_text="What a running job does after its last step (cross-validation, gating, writing); "
        "empty while it steps and once it has finished",
    )
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)
    artifact_path = models.CharField(max_length=500, blank=True, help_text="Relative to VAR_DIR")
    candidate = models.OneToOneField(
        ConductorVersion, null=True, blank=True, related_name="training_job", on_delete=models.PROTECT
    )
    celery_task_id = models.CharField(max_length=200, blank=True)
    worker_host = models.CharField(max_length=200, blank=True)
    worker_pid = models.PositiveIntegerField(null=True, blank=True)
    deliveries = models.PositiveIntegerField(
        default=0, help_text="How many times a worker process took this job"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, related_name="+", on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"Training job {self.pk} ({self.name})"

    @property
    def progress(self) -> float:
        if self.status == JobStatus.SUCCEEDED:
            return 1.0
        return min(1.0, self.step / self.total_steps) if self.total_steps else 0.0

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class TrainingMetric(models.Model):
    """One logged point of a job's curves (reward, loss, KL where used)."""

    job = models.ForeignKey(TrainingJob, related_name="metrics", on_delete=models.CASCADE)
    step = models.PositiveIntegerField()
    values = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "step", "id"]
        indexes = [models.Index(fields=["job", "step"], name="metric_job_step")]

    def __str__(self) -> str:
        return f"Job {self.job_id} step {self.step}"


class Evaluation(models.Model):
    """A candidate against a baseline (the active conductor) on the same held-out items."""

    candidate = models.ForeignKey(ConductorVersion, related_name="evaluations", on_delete=models.PROTECT)
    baseline = models.ForeignKey(
        ConductorVersion, related_name="baseline_evaluations", on_delete=models.PROTECT
    )
    split = models.CharField(max_length=40, default="dev")
    item_set = models.CharField(max_length=80, default="replay", help_text="The item set evaluated on")
    item_set_version = models.ForeignKey(
        "ItemSetVersion", null=True, blank=True, related_name="evaluations", on_delete=models.PROTECT
    )
    limit = models.PositiveIntegerField(default=100)
    items = models.JSONField(default=list)
    status = models.CharField(max_length=20, choices=JobStatus.choices, default=JobStatus.QUEUED)
    results = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, related_name="+", on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"Evaluation {self.pk}: {self.candidate.name} vs {self.baseline.name}"


class EvaluationRun(models.Model):
    evaluation = models.ForeignKey(Evaluation, related_name="runs", on_delete=models.PROTECT)
    run = models.OneToOneField(Run, related_name="evaluation_run", on_delete=models.PROTECT)
    side = models.CharField(max_length=20, help_text="candidate or baseline")
    item = models.CharField(max_length=200)

    def __str__(self) -> str:
        return f"{self.side} run {self.run_id} on {self.item}"


# --- Item sets: the tasks a team trains and evaluates on --------------------------------------------


class ItemSet(models.Model):
    """A named set of evaluation items a team owns: uploaded from a file, or made from logged tasks and
    reviewers' verdicts. Its items live in numbered versions; the bundled replay benchmark is not a row
    (training.itemsets.selectors.REPLAY_SET reads it in place)."""

    name = models.SlugField(max_length=80, unique=True)
    description = models.TextField(blank=True)
    seed = models.PositiveIntegerField(default=0, help_text="Seeds the split of every item added")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, related_name="+", on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ItemSetVersion(models.Model):
    """One version of a set's items. Frozen (its content hash and manifest written) the first time a
    rollout, an evaluation, a dataset, a job or an export reads it: two evaluations on one version
    compare. Adding to a frozen version makes the next one, its items copied."""

    item_set = models.ForeignKey(ItemSet, related_name="versions", on_delete=models.PROTECT)
    number = models.PositiveIntegerField()
    frozen_at = models.DateTimeField(null=True, blank=True)
    content_hash = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the items' JSON Lines")
    manifest = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["item_set", "-number"]
        constraints = [models.UniqueConstraint(fields=["item_set", "number"], name="itemset_version_once")]

    def __str__(self) -> str:
        return f"{self.item_set.name} v{self.number}"

    @property
    def frozen(self) -> bool:
        return self.frozen_at is not None


class ItemSplit(models.TextChoices):
    TRAIN = "train", "train"
    DEV = "dev", "dev"
    TEST = "test", "test"


class Item(models.Model):
    """One evaluation item of a version: a task's text, an optional reference and the scorer that reads
    it, the owner's kind label (the learned policy's kind), a data class, its split, and where it came
    from. `key` is its id in the set; `<set>/<key>` names it in rollouts, datasets and evaluations."""

    class Origin(models.TextChoices):
        FILE = "file", "Uploaded file"
        TASK = "task", "Logged task"
        REVIEW = "review", "Review verdict"

    version = models.ForeignKey(ItemSetVersion, related_name="items", on_delete=models.PROTECT)
    key = models.CharField(max_length=80)
    text = models.TextField()
    reference = models.TextField(null=True, blank=True)  # noqa: DJ001 - None means "no reference"
    scorer = models.CharField(max_length=20, default="auto")
    kind = models.CharField(max_length=40)
    classification = models.CharField(max_length=20, choices=DataClass.choices, default=DataClass.INTERNAL)
    split = models.CharField(max_length=10, choices=ItemSplit.choices)
    origin = models.CharField(max_length=10, choices=Origin.choices)
    source_task = models.ForeignKey(
        Task, null=True, blank=True, related_name="set_items", on_delete=models.PROTECT
    )
    source_run = models.ForeignKey(Run, null=True, blank=True, related_name="+", on_delete=models.PROTECT)
    verdict = models.CharField(max_length=10, blank=True, help_text="The reviewer's verdict it was made from")
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, related_name="+", on_delete=models.SET_NULL
    )
    added_at = models.DateTimeField(auto_now_add=True)
    purged_at = models.DateTimeField(null=True, blank=True, help_text="Its source task's content was deleted")

    class Meta:
        ordering = ["version", "key"]
        constraints = [models.UniqueConstraint(fields=["version", "key"], name="item_key_once")]

    def __str__(self) -> str:
        return f"{self.version} / {self.key}"
