"""The API's run comparison: two to four runs side by side."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.roles import EVERYONE
from audit.services import record_viewed
from operations.compare import side_by_side
from operations.tasks.serializers import (
    RunComparisonOutput,
)


class RunCompareView(APIView):
    """Two to four runs side by side, as the compare page shows them (operations.compare.side_by_side)."""

    required_roles = {"GET": EVERYONE}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                side_by_side.RUN_PARAM,
                int,
                many=True,
                required=True,
                explode=True,
                description=f"A run id; {side_by_side.MIN_RUNS} to {side_by_side.MAX_RUNS} of them: ?run=12&run=15",
            )
        ],
        responses={
            200: RunComparisonOutput,
            400: OpenApiResponse(
                description="Fewer than two or more than four run ids, one given twice, or an id that is no run"
            ),
        },
        description="The runs' conductors, outcomes, plans (steps aligned by position), answers, costs, "
        "latencies and tokens, row by row, each row saying whether it differs between the runs. "
        "Recorded as a view of each run's task.",
    )
    def get(self, request: Request) -> Response:
        runs = side_by_side.runs_for_compare(side_by_side.run_ids(request.query_params))
        for task in {run.task_id: run.task for run in runs}.values():
            record_viewed(request=request, task=task, view="run comparison (api)")
        return Response(RunComparisonOutput(side_by_side.compare_runs(runs)).data)
