"""The API's shapes: what a task submission takes, a task, run, decision, step, attempt and worker as
read, and runs compared side by side."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from audit.chain import run_chain
from audit.models import ChainHead
from operations.compare import side_by_side
from routing import limits
from routing.models import Attempt, ConductorVersion, DataClass, Decision, Run, Step, Task, Worker
from routing.plans import visible_indices
from routing.scoring.scorers import SCORER_CHOICES


class TaskSubmitInput(serializers.Serializer):
    # The limits are routing.limits' validators, shared with the web form and the service.
    text = serializers.CharField(trim_whitespace=False, allow_blank=False)
    reference = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, trim_whitespace=False
    )
    classification = serializers.ChoiceField(choices=DataClass.choices, default=DataClass.INTERNAL)
    max_steps = serializers.IntegerField(required=False, validators=limits.MAX_STEPS_VALIDATORS)
    max_depth = serializers.IntegerField(required=False, validators=limits.MAX_DEPTH_VALIDATORS)
    max_usd = serializers.DecimalField(
        required=False,
        max_digits=limits.USD_MAX_DIGITS,  # refused before it is rounded: 1e30 is a 400, not a 500
        decimal_places=limits.USD_DECIMAL_PLACES,
        validators=limits.MAX_USD_VALIDATORS,
        help_text=f"The task's cost budget in USD, 0 to {limits.MAX_USD}",
    )
    idempotency_key = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, validators=limits.IDEMPOTENCY_KEY_VALIDATORS
    )
    scorer = serializers.ChoiceField(choices=SCORER_CHOICES, default="auto")
    domain = serializers.CharField(
        required=False, allow_blank=True, max_length=limits.DOMAIN_MAX_CHARS, default=""
    )

    def validate_text(self, text: str) -> str:
        try:
            limits.text_length_check(text)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.messages) from exc
        return text


class AttemptOutput(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = [
            "number",
            "status",
            "http_status",
            "error",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "latency_ms",
            "provider_request_id",
            "started_at",
            "finished_at",
        ]


class StepOutput(serializers.ModelSerializer):
    attempts = AttemptOutput(many=True, read_only=True)
    sees = serializers.SerializerMethodField(help_text="Indices of the earlier steps of its plan it sees")

    class Meta:
        model = Step
        fields = [
            "id",
            "decision",
            "index",
            "depth",
            "worker_slug",
            "vendor",
            "instruction",
            "access",
            "sees",
            "status",
            "messages_sent",
            "response",
            "note",
            "error",
            "cost_usd",
            "input_tokens",
            "output_tokens",
            "latency_ms",
            "started_at",
            "finished_at",
            "attempts",
        ]

    def get_sees(self, step: Step) -> list[int]:
        return visible_indices(step.access, step.index)


class DecisionOutput(serializers.ModelSerializer):
    class Meta:
        model = Decision
        fields = [
            "id",
            "parent_step",
            "depth",
            "attempt",
            "backend",
            "version_name",
            "raw_output",
            "plan",
            "valid",
            "error",
            "alternatives",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "latency_ms",
            "created_at",
        ]


class RunOutput(serializers.ModelSerializer):
    conductor = serializers.CharField(source="conductor_version.name")
    audit_seq = serializers.SerializerMethodField(
        help_text="The run's last audit event number; live events continue from it without gaps"
    )
    decisions = DecisionOutput(many=True, read_only=True)
    steps = StepOutput(many=True, read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "kind",
            "status",
            "conductor",
            "correlation_id",
            "deliveries",
            "final_answer",
            "score",
            "stop_reason",
            "error",
            "cost_usd",
            "input_tokens",
            "output_tokens",
            "created_at",
            "started_at",
            "finished_at",
            "decisions",
            "steps",
            "audit_seq",
        ]

    def get_audit_seq(self, run: Run) -> int:

        head = (
            ChainHead.objects.filter(chain=run_chain(run.correlation_id))
            .values_list("seq", flat=True)
            .first()
        )
        return head or 0


class FinalWorkerFields(serializers.Serializer):
    """Who gave a task's final answer, and whether to trust it less: the annotations of
    routing.selectors.with_final_worker."""

    final_worker = serializers.CharField(
        read_only=True, allow_null=True, help_text="The worker that gave the final answer (its slug)"
    )
    final_answer_weak = serializers.BooleanField(
        read_only=True,
        help_text="The final answer is a weak worker's (a demo-grade model, such as the local 135M one)",
    )


class TaskListOutput(FinalWorkerFields, serializers.ModelSerializer):
    class Meta:
        model = Task
        fields = [
            "id",
            "text",
            "classification",
            "status",
            "final_worker",
            "final_answer_weak",
            "score",
            "cost_usd",
            "input_tokens",
            "output_tokens",
            "domain",
            "source",
            "created_at",
            "finished_at",
        ]


class TaskDetailOutput(FinalWorkerFields, serializers.ModelSerializer):
    runs = RunOutput(many=True, read_only=True)

    class Meta:
        model = Task
        fields = [
            "id",
            "text",
            "reference",
            "scorer",
            "domain",
            "source_item",
            "classification",
            "max_steps",
            "max_depth",
            "max_usd",
            "idempotency_key",
            "source",
            "status",
            "final_answer",
            "final_worker",
            "final_answer_weak",
            "score",
            "error",
            "cost_usd",
            "input_tokens",
            "output_tokens",
            "created_at",
            "finished_at",
            "runs",
        ]


class WorkerOutput(serializers.ModelSerializer):
    class Meta:
        model = Worker
        fields = [
            "slug",
            "display_name",
            "litellm_model",
            "vendor",
            "region",
            "self_hosted",
            "input_usd_per_mtok",
            "output_usd_per_mtok",
            "price_source",
            "context_window",
            "enabled",
            "data_classes",
            "description",
            "weak",
        ]


class ConductorVersionOutput(serializers.ModelSerializer):
    class Meta:
        model = ConductorVersion
        fields = ["name", "backend", "is_active", "created_at", "notes"]


# --- Runs side by side (operations.compare.side_by_side) ----------------------------------------------------------


@extend_schema_field(
    {
        "type": "array",
        "items": {"nullable": True, "oneOf": [{"type": "string"}, {"type": "number"}]},
        "description": "One value per run, in the order of `runs`; null where the run has none "
        "(a step it lacks). Money is a decimal string.",
    }
)
class ComparedValues(serializers.Field):
    def to_representation(self, values):
        return [str(v) if isinstance(v, Decimal) else v for v in values]


class ComparisonRowOutput(serializers.Serializer):
    field = serializers.CharField()
    label = serializers.CharField()
    kind = serializers.ChoiceField(choices=list(side_by_side.KINDS), help_text="How the values read")
    differs = serializers.BooleanField(help_text="The runs' values are not all equal")
    values = ComparedValues(read_only=True)


class ComparisonSectionOutput(serializers.Serializer):
    key = serializers.CharField(help_text='"run", "plan", or a step by its position: "step-0", "step-1.0"')
    title = serializers.CharField()
    differs = serializers.BooleanField()
    rows = ComparisonRowOutput(many=True)


class ComparedRunOutput(serializers.Serializer):
    id = serializers.IntegerField()
    task_id = serializers.UUIDField()
    kind = serializers.CharField()


class RunComparisonOutput(serializers.Serializer):
    runs = ComparedRunOutput(many=True)
    rows = serializers.IntegerField(help_text="How many rows the comparison has")
    differing = serializers.IntegerField(help_text="How many of them differ between the runs")
    sections = ComparisonSectionOutput(many=True)
