"""The API of review (review.annotations.services): verdicts on runs and steps, listed and recorded."""

from __future__ import annotations

from functools import partial

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.roles import EVERYONE
from review.annotations import services as review
from routing.models import Annotation
from utilities import params
from utilities.filters import RuleFilter, StrictFilterSet, choice, moment
from utilities.pagination import StrictCursorPagination


class AnnotationOutput(serializers.ModelSerializer):
    task_id = serializers.UUIDField(source="run.task_id", read_only=True)

    class Meta:
        model = Annotation
        fields = ["id", "run", "task_id", "step", "verdict", "label", "comment", "author_name", "created_at"]


class AnnotationInput(serializers.Serializer):
    run = serializers.IntegerField(min_value=1, max_value=review.ID_MAX)
    step = serializers.IntegerField(min_value=1, max_value=review.ID_MAX, required=False, allow_null=True)
    verdict = serializers.ChoiceField(choices=Annotation.Verdict.choices)
    label = serializers.CharField(max_length=review.LABEL_MAX, required=False, allow_blank=True, default="")
    comment = serializers.CharField(
        max_length=review.COMMENT_MAX, required=False, allow_blank=True, default="", trim_whitespace=False
    )


class AnnotationFilter(StrictFilterSet):
    """Read with the project's strict rules: a bad value is refused with its reason (400)."""

    run = RuleFilter(partial(params.integer, minimum=1, maximum=review.ID_MAX))
    step = RuleFilter(partial(params.integer, minimum=1, maximum=review.ID_MAX))
    task = RuleFilter(params.uuid, field_name="run__task_id")
    verdict = choice(Annotation.Verdict.values)
    label = RuleFilter(params.text)
    since = moment(field_name="created_at", lookup_expr="gte", label="recorded at or after (a zone, or UTC)")
    until = moment(
        end=True, field_name="created_at", lookup_expr="lt", label="recorded before (a zone, or UTC)"
    )

    class Meta:
        model = Annotation
        fields: list[str] = []


class NewestFirst(StrictCursorPagination):
    ordering = ("-id",)


class AnnotationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Reviewers' verdicts, the newest first. Any role reads them; auditors and ML staff record them."""

    required_roles = {"GET": EVERYONE, "POST": review.REVIEWERS}
    queryset = Annotation.objects.select_related("run")
    serializer_class = AnnotationOutput
    filterset_class = AnnotationFilter
    pagination_class = NewestFirst

    @extend_schema(
        request=AnnotationInput,
        responses={201: AnnotationOutput},
        description="Mark a run's answer (or, with `step`, one step's) correct or wrong, with a label and a "
        "comment; recorded as an `annotation.added` audit event. The newest verdict on a run is its human label.",
    )
    def create(self, request: Request) -> Response:
        data = AnnotationInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        annotation = review.annotation_add(
            verdict=review.Verdict(
                run_id=values["run"],
                verdict=values["verdict"],
                label=values["label"],
                comment=values["comment"],
                step_id=values.get("step"),
            ),
            user=request.user,
        )
        return Response(AnnotationOutput(annotation).data, status=status.HTTP_201_CREATED)
