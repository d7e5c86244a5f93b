"""The training API: what the /training/ pages do, for ML staff's scripts.

Every write goes through training.services (one transaction and an audit event each), acting as the
request's user; a refusal of the service is a 400 with its message. ML staff (and admins) may do
everything, auditors may read, other roles get 403.
"""

from __future__ import annotations

from typing import Any

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.models import Role
from accounts.roles import request_roles
from audit.services import Actor
from routing.models import ConductorVersion
from routing.services import conductor_active
from training import durations, quotas, services

from .itemsets.selectors import split_ids
from .models import FINISHED, Dataset, Evaluation, RolloutBatch, TrainingJob
from .rewards import RewardConfig
from .serializers import (
    ConductorOutput,
    DatasetBuildInput,
    DatasetDetailOutput,
    DatasetListOutput,
    EstimateOutput,
    EvaluationOutput,
    EvaluationStartInput,
    JobDetailOutput,
    JobListOutput,
    JobStartInput,
    MetricOutput,
    MetricsOutput,
    MetricsQuery,
    PromoteInput,
    RolloutBatchDetailOutput,
    RolloutBatchOutput,
    RolloutsStartInput,
    ShadowInput,
)

READERS = (Role.ML_STAFF, Role.AUDITOR)
WRITERS = (Role.ML_STAFF,)
METRICS_PER_PAGE = 2000
# The body is the API's Error shape (conductor_web.api_errors adds the schema to every error response).
REFUSED = OpenApiResponse(description="The service refused the request; detail says why")


def _estimate(estimate: Any) -> Response:
    """A dry run's answer: what the start would do; nothing was started."""
    return Response({"dry_run": True, **estimate.as_dict()}, status=status.HTTP_200_OK)


def _actor(request: Request) -> Actor:
    return Actor.for_user(request.user)


class TrainingViewSet(viewsets.GenericViewSet):
    required_roles = {"GET": READERS, "HEAD": READERS, "OPTIONS": READERS, "POST": WRITERS}


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TrainingViewSet):
    """Training jobs: each trains a candidate conductor version on the training queue."""

    filterset_fields = ["status", "backend"]

    def get_queryset(self):
        jobs = TrainingJob.objects.select_related("candidate", "created_by")
        return jobs.defer("log") if self.action == "list" else jobs

    def get_serializer_class(self):
        return JobListOutput if self.action == "list" else JobDetailOutput

    @extend_schema(
        request=JobStartInput,
        responses={201: JobDetailOutput, 400: REFUSED},
        description="Queue a training job (training.services.job_start): the options not given take the "
        "backend's defaults.",
    )
    def create(self, request: Request) -> Response:
        data = JobStartInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        job = services.job_start(
            name=values["name"],
            backend=values["backend"],
            dataset=values["dataset"],
            options=values["options"],
            actor=_actor(request),
            user=request.user,
        )
        return Response(
            JobDetailOutput(self.get_queryset().get(pk=job.pk)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        parameters=[MetricsQuery],
        responses=MetricsOutput,
        description=f"The job's curve points logged after step `after` (all without it), at most "
        f"{METRICS_PER_PAGE} at a time.",
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None, format: str | None = None) -> Response:
        job = self.get_object()
        query = MetricsQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        after = query.validated_data["after"]
        points = list(job.metrics.filter(step__gt=after).order_by("step", "id")[: METRICS_PER_PAGE + 1])
        body = {
            "job": job.pk,
            "status": job.status,
            "step": job.step,
            "total_steps": job.total_steps,
            "after": after,
            "points": MetricOutput(points[:METRICS_PER_PAGE], many=True).data,
            "more": len(points) > METRICS_PER_PAGE,
        }
        return Response(body)

    @extend_schema(
        request=None,
        responses={200: JobDetailOutput, 400: REFUSED},
        description="Ask the job to stop (a queued job is cancelled at once).",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None, format: str | None = None) -> Response:
        job = self.get_object()
        services.job_cancel(job=job, actor=_actor(request))
        return Response(JobDetailOutput(self.get_queryset().get(pk=job.pk)).data)


class DatasetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TrainingViewSet):
    """Versioned GRPO datasets built from finished rollouts."""

    def get_queryset(self):
        datasets = Dataset.objects.select_related("created_by")
        return datasets.defer("source_run_ids") if self.action == "list" else datasets

    def get_serializer_class(self):
        return DatasetListOutput if self.action == "list" else DatasetDetailOutput

    @extend_schema(
        request=DatasetBuildInput,
        responses={201: DatasetDetailOutput, 400: REFUSED},
        description="Build the next version of a dataset from the finished rollouts matching the filter.",
    )
    def create(self, request: Request) -> Response:
        data = DatasetBuildInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        dataset = services.dataset_build(
            name=values["name"],
            batch_ids=values["batch_ids"],
            conductor_version=values["conductor_version"],
            since=values["since"],
            until=values["until"],
            items=values["items"] or None,
            min_group_size=values["min_group_size"],
            reward_config=RewardConfig.from_dict(values["reward"]),
            validation_fraction=values["validation_fraction"],
            actor=_actor(request),
            user=request.user,
        )
        body = DatasetDetailOutput(dataset, context=self.get_serializer_context()).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            404: OpenApiResponse(description="No such dataset, or no such file in it"),
        },
        description="One of the dataset's files (train/validation Parquet or JSON Lines, manifest.json).",
    )
    @action(detail=True, methods=["get"], url_path=r"files/(?P<name>[A-Za-z0-9._-]+)", url_name="file")
    def file(
        self, request: Request, pk: str | None = None, name: str = "", format: str | None = None
    ) -> FileResponse:
        files = services.dataset_files(self.get_object())
        if name not in files:
            raise NotFound("no such file in this dataset")
        return FileResponse(files[name].open("rb"), as_attachment=True, filename=name)


class RolloutBatchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TrainingViewSet):
    """Rollout batches: K sampled workflows per item of a set (or a survey of the workers), each run through the engine."""

    def get_queryset(self):
        return RolloutBatch.objects.select_related("conductor_version", "created_by", "item_set_version")

    def get_serializer_class(self):
        return RolloutBatchOutput if self.action == "list" else RolloutBatchDetailOutput

    def _detail(self, batch: RolloutBatch, **kwargs: Any) -> Response:
        counts = services.rollout_batch_counts(batch)  # reads only: the batch finishes when its last run ends
        return Response(RolloutBatchDetailOutput(batch, context={"counts": counts}).data, **kwargs)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self._detail(self.get_object())

    @extend_schema(
        request=RolloutsStartInput,
        responses={201: RolloutBatchDetailOutput, 200: EstimateOutput, 400: REFUSED},
        description="Sample K workflows per item from a conductor version: the items given, or the first "
        "`limit` items of a set's split (of one kind, if given); `survey`: every allowed worker answers each item once. Refused above "
        f"{quotas.MAX_RUNS_PER_REQUEST:,} runs (items x K) per request, or when it would take your queued "
        "offline runs above CONDUCTOR_MAX_QUEUED_RUNS_PER_USER. `dry_run`: the runs and their estimated "
        "cost (200), nothing started.",
    )
    def create(self, request: Request) -> Response:
        data = RolloutsStartInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if "items" in values:
            items = values["items"]
        else:
            items = split_ids(
                values["item_set"], values["split"], limit=values["limit"], kind=values["domain"]
            )
        asked = {
            "version": values["version"],
            "items": items,
            "k": values["k"],
            "temperature": values["temperature"],
            "item_set": values["item_set"],
            "survey": values["survey"],
            "user": request.user,
        }
        if values["dry_run"]:
            return _estimate(services.rollouts_estimate(**asked))
        batch = services.rollouts_start(
            **asked, actor=_actor(request), shown_usd=values["shown_usd"], max_usd=values["max_usd"]
        )
        return self._detail(self.get_queryset().get(pk=batch.pk), status=status.HTTP_201_CREATED)


class EvaluationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TrainingViewSet):
    """Evaluations: a candidate against a baseline on the same held-out items."""

    serializer_class = EvaluationOutput

    def get_queryset(self):
        return Evaluation.objects.select_related("candidate", "baseline", "created_by", "item_set_version")

    def _detail(self, evaluation: Evaluation, **kwargs: Any) -> Response:
        """One evaluation, with its progress and expected duration (reads only)."""
        progress = durations.evaluation_progress(evaluation)
        timing = {"progress": progress, "duration": durations.evaluation_duration(evaluation, progress)}
        return Response(EvaluationOutput(evaluation, context=timing).data, **kwargs)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        evaluation = self.get_object()
        if evaluation.status not in FINISHED:
            evaluation.results = services.evaluation_summary(evaluation)  # so far; reads only
        return self._detail(evaluation)

    @extend_schema(
        request=EvaluationStartInput,
        responses={201: EvaluationOutput, 200: EstimateOutput, 400: REFUSED},
        description="Run the candidate and the baseline (the active conductor by default) on the first "
        "`limit` items of a set's split (`item_set`; the bundled `replay` by default): a limit above the split's items is refused, as are more than "
        f"{quotas.MAX_RUNS_PER_REQUEST:,} runs (items x 2) per request and a start that would take your "
        "queued offline runs above CONDUCTOR_MAX_QUEUED_RUNS_PER_USER. `dry_run`: the runs, their "
        "estimated cost and expected duration (200), nothing started.",
    )
    def create(self, request: Request) -> Response:
        data = EvaluationStartInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if values["dry_run"]:
            return _estimate(
                services.evaluation_estimate(
                    candidate=values["candidate"],
                    baseline=values["baseline"],
                    split=values["split"],
                    limit=values["limit"],
                    item_set=values["item_set"],
                    user=request.user,
                )
            )
        evaluation = services.evaluation_start(
            candidate=values["candidate"],
            baseline=values["baseline"],
            split=values["split"],
            limit=values["limit"],
            item_set=values["item_set"],
            shown_usd=values["shown_usd"],
            max_usd=values["max_usd"],
            actor=_actor(request),
            user=request.user,
        )
        return self._detail(self.get_queryset().get(pk=evaluation.pk), status=status.HTTP_201_CREATED)


class ConductorViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TrainingViewSet):
    """Conductor versions, by name: which is active, which shadows; promotion, rollback, shadow mode."""

    serializer_class = ConductorOutput
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    pagination_class = None

    def get_queryset(self):
        return ConductorVersion.objects.order_by("-created_at", "-id")

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        conductor_active()  # the static baseline exists from the first look on, as on the pages
        return super().list(request, *args, **kwargs)

    def _version(self, name: str) -> Response:
        return Response(ConductorOutput(self.get_queryset().get(name=name)).data)

    @extend_schema(
        request=PromoteInput,
        responses={200: ConductorOutput, 400: REFUSED},
        description="Make this version the active conductor (loading its LoRA adapter into vLLM first, if any). "
        "With an evaluation of it, the promotion gate applies, as on the evaluation page.",
    )
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, name: str | None = None, format: str | None = None) -> Response:
        version = self.get_object()
        data = PromoteInput(data=request.data)
        data.is_valid(raise_exception=True)
        evaluation = None
        if data.validated_data.get("evaluation") is not None:
            evaluation = Evaluation.objects.filter(
                pk=data.validated_data["evaluation"], candidate=version
            ).first()
            if evaluation is None:
                raise NotFound(f"no evaluation {data.validated_data['evaluation']} of {version.name}")
        services.conductor_promote(
            version=version,
            actor=_actor(request),
            evaluation=evaluation,
            override_reason=data.validated_data.get("override_reason", ""),
            may_override=Role.ADMIN in request_roles(request),
        )
        return self._version(version.name)

    @extend_schema(
        request=None,
        responses={200: ConductorOutput, 400: REFUSED},
        description="Re-activate the version that was active before the current one; answers with it.",
    )
    @action(detail=False, methods=["post"])
    def rollback(self, request: Request, format: str | None = None) -> Response:
        version = services.conductor_rollback(actor=_actor(request))
        return self._version(version.name)

    @extend_schema(
        request=ShadowInput,
        responses={200: ConductorOutput, 400: REFUSED},
        description='{"on": true}: this version plans every new live task alongside the active one, without '
        'affecting it (replacing any other shadow). {"on": false}: it stops (nothing changes when it '
        "is not the shadow).",
    )
    @action(detail=True, methods=["post"])
    def shadow(self, request: Request, name: str | None = None, format: str | None = None) -> Response:
        version = self.get_object()
        data = ShadowInput(data=request.data)
        data.is_valid(raise_exception=True)
        if data.validated_data["on"]:
            services.shadow_set(version=version, actor=_actor(request))
        elif version.is_shadow:
            services.shadow_set(version=None, actor=_actor(request))
        return self._version(version.name)
