"""The training API's serializers: inputs (what a script may send) apart from outputs (what it reads).

Inputs check types and shapes only; the rules (names, ranges, backends' settings) are the services',
so the API answers with the same messages as the pages.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from routing.limits import NAME_RULE, name_check
from routing.models import ConductorVersion
from training import quotas, services

from .models import Dataset, Evaluation, JobStatus, RolloutBatch, TrainingJob, TrainingMetric

LOG_TAIL_CHARS = 8000


# Named enum components of their own: drf-spectacular would otherwise merge these choice sets with
# routing's fields of the same names ("status", "backend") and warn about the collision.
@extend_schema_field({"type": "string", "enum": list(JobStatus.values)}, component_name="TrainingStatusEnum")
class TrainingStatusField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any):
        super().__init__(choices=JobStatus.choices, **kwargs)


@extend_schema_field(
    {"type": "string", "enum": list(TrainingJob.Backend.values)}, component_name="TrainingBackendEnum"
)
class TrainingBackendField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any):
        super().__init__(choices=TrainingJob.Backend.choices, **kwargs)


@extend_schema_field(
    {"type": "string", "enum": list(ConductorVersion.Backend.values)},
    component_name="ConductorBackendEnum",
)
class ConductorBackendField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any):
        super().__init__(choices=ConductorVersion.Backend.choices, **kwargs)


class VersionField(serializers.SlugRelatedField):
    """A conductor version, by its name."""

    def __init__(self, **kwargs: Any):
        super().__init__(slug_field="name", queryset=ConductorVersion.objects.all(), **kwargs)


# --- inputs --------------------------------------------------------------------------------------

DRY_RUN_HELP = (
    "true: check the request as a start would and answer (200) with the runs it would start and their "
    "estimated cost; nothing is started or created"
)


class JobStartInput(serializers.Serializer):
    name = serializers.CharField(
        validators=[name_check],
        help_text=f"The candidate conductor version this job registers. {NAME_RULE}",
    )
    backend = TrainingBackendField()
    dataset = serializers.PrimaryKeyRelatedField(
        queryset=Dataset.objects.all(), required=False, allow_null=True, default=None
    )
    options = serializers.DictField(
        required=False,
        default=dict,
        help_text="The backend's settings; those left out take the defaults (learned: split, limit, "
        "epochs, learning_rate, group_size, cost_penalty_per_usd; llm-lora: base_model_path, max_steps, "
        "num_generations, prompts_per_step, learning_rate, lora_r, max_completion_length, "
        "cost_penalty_per_usd, format_term, use_vllm, vllm_server_base_url, allow_no_signal: train on a "
        "dataset none of whose groups carries a learning signal, refused otherwise)",
    )


class MetricsQuery(serializers.Serializer):
    after = serializers.IntegerField(
        required=False, default=-1, min_value=-1, max_value=2**31 - 1, help_text="Only points after this step"
    )


class RewardInput(serializers.Serializer):
    correctness = serializers.FloatField(required=False, default=1.0)
    cost_penalty_per_usd = serializers.FloatField(required=False, default=0.0)
    format_term = serializers.BooleanField(required=False, default=False)
    human_labels = serializers.BooleanField(
        required=False,
        default=False,
        help_text="A reviewer's verdict on a run, where there is one, in place of its score",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and set(data) - set(self.fields):
            raise serializers.ValidationError(
                f"unknown reward settings: {sorted(set(data) - set(self.fields))}"
            )
        return super().to_internal_value(data)


class DatasetBuildInput(serializers.Serializer):
    name = serializers.CharField(
        validators=[name_check],
        help_text=f"Building the same name again makes its next version. {NAME_RULE}",
    )
    batch_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        allow_null=True,
        default=None,
        help_text="Rollout batches to take (none: every batch)",
    )
    conductor_version = VersionField(
        required=False, allow_null=True, default=None, help_text="Only rollouts sampled from this version"
    )
    since = serializers.DateTimeField(required=False, allow_null=True, default=None)
    until = serializers.DateTimeField(required=False, allow_null=True, default=None)
    items = serializers.ListField(
        child=serializers.CharField(max_length=200),
        required=False,
        allow_null=True,
        default=None,
        help_text="Item ids (none: all)",
    )
    min_group_size = serializers.IntegerField(required=False, default=2)
    reward = RewardInput(required=False, allow_null=True, default=None)
    validation_fraction = serializers.FloatField(required=False, default=0.1)

    def validate_batch_ids(self, value: list[int] | None) -> list[int] | None:
        if value:
            known = set(RolloutBatch.objects.filter(pk__in=value).values_list("pk", flat=True))
            missing = sorted(set(value) - known)
            if missing:
                raise serializers.ValidationError(f"unknown rollout batches: {missing}")
        return value or None


ITEM_SET = serializers.CharField(
    required=False,
    default="replay",
    max_length=80,
    help_text="The item set: one of yours, or `replay` (the bundled benchmark)",
)
BUDGET = serializers.DecimalField(
    required=False, allow_null=True, default=None, max_digits=20, decimal_places=6, min_value=0,
    help_text="Refused (nothing started) when the estimate is above it",
)  # fmt: skip
SHOWN = serializers.DecimalField(
    required=False, allow_null=True, default=None, max_digits=20, decimal_places=6, min_value=0,
    help_text="The estimate a dry run gave: refused (nothing started) if it changed since",
)  # fmt: skip


class RolloutsStartInput(serializers.Serializer):
    version = VersionField(help_text="The conductor version to sample from")
    items = serializers.ListField(
        child=serializers.CharField(max_length=200),
        required=False,
        help_text="Item ids (`<set>/<key>` for a team's set, the recorded id for the replay set); or leave "
        "out and give split (+ limit, domain)",
    )
    item_set = ITEM_SET
    survey = serializers.BooleanField(
        required=False, default=False, help_text="Every allowed worker answers each item once (K is not used)"
    )
    max_usd = BUDGET
    shown_usd = SHOWN
    split = serializers.CharField(required=False, default="train", max_length=40)
    limit = serializers.IntegerField(
        required=False, default=services.ROLLOUT_DEFAULTS["limit"], min_value=1, max_value=services.MAX_ITEMS
    )
    domain = serializers.CharField(required=False, default="", allow_blank=True, max_length=40)
    k = serializers.IntegerField(
        required=False, default=services.ROLLOUT_DEFAULTS["k"], help_text="Samples per item (the GRPO group)"
    )
    temperature = serializers.FloatField(
        required=False, allow_null=True, default=None, help_text=services.ROLLOUT_TEMPERATURE_HELP
    )
    dry_run = serializers.BooleanField(required=False, default=False, help_text=DRY_RUN_HELP)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = set(self.initial_data) if isinstance(self.initial_data, dict) else set()
        if "items" in attrs and given & {"split", "limit", "domain"}:
            raise serializers.ValidationError("give items, or split (with limit and domain), not both")
        # The items asked for x K (a split may have fewer: the service counts those), as the form does.
        asked = len(set(attrs["items"])) if "items" in attrs else attrs["limit"]
        quotas.rollout_runs_check(asked, attrs["k"])
        return attrs


class EvaluationStartInput(serializers.Serializer):
    candidate = VersionField()
    baseline = VersionField(
        required=False, allow_null=True, default=None, help_text="The active conductor when left out"
    )
    item_set = ITEM_SET
    max_usd = BUDGET
    shown_usd = SHOWN
    split = serializers.CharField(required=False, default="dev", max_length=40)
    limit = serializers.IntegerField(
        required=False, default=100, help_text="Items; at most the split's (refused above it, not capped)"
    )
    dry_run = serializers.BooleanField(required=False, default=False, help_text=DRY_RUN_HELP)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        quotas.evaluation_runs_check(attrs["limit"])  # the split's size is the service's check
        return attrs


class PlanTimeOutput(serializers.Serializer):
    version = serializers.CharField()
    seconds = serializers.FloatField(help_text="Its time per plan")
    logged_plans = serializers.IntegerField(
        help_text="The logged plans it is the mean of (0: its kind's default)"
    )


class DurationOutput(serializers.Serializer):
    """About how long an evaluation takes (training.durations): items x each side's time per plan."""

    seconds = serializers.FloatField(help_text="In all, one run at a time")
    remaining_seconds = serializers.FloatField(
        allow_null=True, help_text="Left while it runs (null: it has ended)"
    )
    per_plan = PlanTimeOutput(many=True)
    basis = serializers.CharField(help_text="What the figure is from, in words")
    message = serializers.CharField()


class ProgressOutput(serializers.Serializer):
    items_done = serializers.IntegerField(help_text="Items whose runs on both sides have ended")
    items = serializers.IntegerField()
    runs_done = serializers.IntegerField()
    runs = serializers.IntegerField()


class EstimateOutput(serializers.Serializer):
    """What a start would do (a dry run): nothing was started."""

    dry_run = serializers.BooleanField()
    runs = serializers.IntegerField(help_text="The runs it would start")
    estimated_usd = serializers.DecimalField(
        max_digits=20,
        decimal_places=4,
        allow_null=True,
        coerce_to_string=True,
        help_text="About what they would cost (null: no finished runs to estimate from)",
    )
    estimated_from = serializers.CharField(help_text="What the estimate is from, in words")
    message = serializers.CharField()
    expected_duration = DurationOutput(required=False, help_text="An evaluation's: about how long it takes")


class PromoteInput(serializers.Serializer):
    evaluation = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="The evaluation of this version the promotion is decided on: its deltas are kept, and it is "
        "refused when the baseline dominates the candidate on its items (the promotion gate)",
    )
    override_reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=services.OVERRIDE_REASON_MAX_CHARS,
        help_text="Admins only: promote despite the gate, for this reason (kept in the audit record)",
    )


class ShadowInput(serializers.Serializer):
    on = serializers.BooleanField(help_text="true: this version shadows live tasks; false: it stops")


# --- outputs -------------------------------------------------------------------------------------


class JobListOutput(serializers.ModelSerializer):
    backend = TrainingBackendField()
    status = TrainingStatusField()
    progress = serializers.FloatField(help_text="0 to 1")
    candidate = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = TrainingJob
        fields = [
            "id", "name", "backend", "dataset", "status", "step", "total_steps", "progress", "candidate",
            "created_at", "started_at", "finished_at",
        ]  # fmt: skip


class JobDetailOutput(JobListOutput):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    log_tail = serializers.SerializerMethodField(help_text=f"The last {LOG_TAIL_CHARS} characters of the log")

    class Meta(JobListOutput.Meta):
        fields = [
            *JobListOutput.Meta.fields, "options", "cancel_requested", "error", "artifact_path", "deliveries",
            "created_by", "log_tail",
        ]  # fmt: skip

    def get_log_tail(self, job: TrainingJob) -> str:
        return job.log[-LOG_TAIL_CHARS:]


class MetricOutput(serializers.ModelSerializer):
    class Meta:
        model = TrainingMetric
        fields = ["step", "values", "created_at"]


class MetricsOutput(serializers.Serializer):
    job = serializers.IntegerField()
    status = TrainingStatusField()
    step = serializers.IntegerField()
    total_steps = serializers.IntegerField()
    after = serializers.IntegerField()
    points = MetricOutput(many=True)
    more = serializers.BooleanField(help_text="More points follow: ask again with after = the last step")


class DatasetListOutput(serializers.ModelSerializer):
    class Meta:
        model = Dataset
        fields = ["id", "name", "version", "counts", "content_hash", "created_at"]


class DatasetFileOutput(serializers.Serializer):
    name = serializers.CharField()
    size = serializers.IntegerField()
    url = serializers.URLField(help_text="Download (same roles as the API's reads)")


class DatasetDetailOutput(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    files = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = [
            "id", "name", "version", "created_at", "created_by", "filter", "reward_config", "counts",
            "content_hash", "source_run_ids", "path", "files",
        ]  # fmt: skip

    @extend_schema_field(DatasetFileOutput(many=True))
    def get_files(self, dataset: Dataset) -> list[dict[str, Any]]:
        request = self.context.get("request")
        rows = []
        for name, path in sorted(services.dataset_files(dataset).items()):
            url = reverse("training-api:dataset-file", args=[dataset.pk, name])
            rows.append(
                {
                    "name": name,
                    "size": path.stat().st_size,
                    "url": request.build_absolute_uri(url) if request is not None else url,
                }
            )
        return rows


class RolloutCountsOutput(serializers.Serializer):
    runs = serializers.IntegerField()
    finished = serializers.IntegerField()
    failed = serializers.IntegerField()


class RolloutBatchOutput(serializers.ModelSerializer):
    conductor = serializers.CharField(source="conductor_version.name")
    item_set_version = serializers.IntegerField(
        source="item_set_version.number", allow_null=True, read_only=True, help_text="null: the replay set"
    )
    status = TrainingStatusField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = RolloutBatch
        fields = [
            "id", "conductor", "item_set", "item_set_version", "survey", "k", "temperature", "items", "status",
            "created_by", "created_at",
        ]  # fmt: skip


class RolloutBatchDetailOutput(RolloutBatchOutput):
    counts = serializers.SerializerMethodField(help_text="The batch's runs: all, finished, failed")

    class Meta(RolloutBatchOutput.Meta):
        fields = [*RolloutBatchOutput.Meta.fields, "counts"]

    @extend_schema_field(RolloutCountsOutput)
    def get_counts(self, batch: RolloutBatch) -> dict[str, int] | None:
        return self.context.get("counts")


class EvaluationOutput(serializers.ModelSerializer):
    candidate = serializers.CharField(source="candidate.name")
    item_set_version = serializers.IntegerField(
        source="item_set_version.number", allow_null=True, read_only=True, help_text="null: the replay set"
    )
    baseline = serializers.CharField(source="baseline.name")
    status = TrainingStatusField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    results = serializers.JSONField(
        read_only=True,
        help_text="Per side (candidate, baseline): version, accuracy, usd_per_1000, p95_plan_ms and "
        "failed, over the `n` runs scored so far; `total` is the side's number of runs (done when "
        "n == total).",
    )
    progress = serializers.SerializerMethodField(help_text="One evaluation's read only (null in lists)")
    expected_duration = serializers.SerializerMethodField(
        help_text="One evaluation's read only (null in lists)"
    )

    class Meta:
        model = Evaluation
        fields = [
            "id", "candidate", "baseline", "item_set", "item_set_version", "split", "limit", "items", "status",
            "results", "progress", "expected_duration", "error", "created_by", "created_at", "finished_at",
        ]  # fmt: skip

    @extend_schema_field(ProgressOutput(allow_null=True))
    def get_progress(self, evaluation: Evaluation) -> dict[str, int] | None:
        progress = self.context.get("progress")
        return progress.as_dict() if progress is not None else None

    @extend_schema_field(DurationOutput(allow_null=True))
    def get_expected_duration(self, evaluation: Evaluation) -> dict[str, Any] | None:
        duration = self.context.get("duration")
        return duration.as_dict() if duration is not None else None


class ConductorOutput(serializers.ModelSerializer):
    backend = ConductorBackendField()

    class Meta:
        model = ConductorVersion
        fields = ["name", "backend", "is_active", "is_shadow", "created_at", "notes"]
