import json

from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion, RunStatus
from training.durations import evaluation_duration, evaluation_progress
from training.models import EvaluationRun
from training.services import TrainingError, evaluation_refresh, evaluation_start


class Command(BaseCommand):
    help = (
        "Evaluate a candidate conductor against the active one (or --baseline) on held-out recorded items, "
        "through the engine. With --inline the runs execute in this process (no worker needed)."
    )

    def add_arguments(self, parser):
        parser.add_argument("candidate", help="conductor version name")
        parser.add_argument("--baseline", help="conductor version name (default: the active one)")
        parser.add_argument(
            "--item-set", default="replay", help="the item set (default: the bundled replay benchmark)"
        )
        parser.add_argument("--split", default="dev")
        parser.add_argument("--limit", type=int, default=100)
        parser.add_argument(
            "--inline", action="store_true", help="execute the runs here and print the results"
        )

    def handle(self, *args, **o):
        try:
            candidate = ConductorVersion.objects.get(name=o["candidate"])
            baseline = ConductorVersion.objects.get(name=o["baseline"]) if o["baseline"] else None
        except ConductorVersion.DoesNotExist as exc:
            raise CommandError(f"no such conductor version: {exc}") from exc
        try:
            evaluation = evaluation_start(
                candidate=candidate,
                baseline=baseline,
                split=o["split"],
                limit=o["limit"],
                item_set=o["item_set"],
                actor=Actor.service("evaluate_conductor"),
            )
        except TrainingError as exc:
            raise CommandError(str(exc)) from exc
        duration = evaluation_duration(evaluation, evaluation_progress(evaluation))  # as its page says
        where = "queued" if not o["inline"] else "running here"
        self.stdout.write(
            f"evaluation {evaluation.pk} {where}: {len(evaluation.items) * 2} runs. {duration.message}"
        )
        if not o["inline"]:
            return
        pending = EvaluationRun.objects.filter(evaluation=evaluation).exclude(
            run__status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]
        )
        for run_id in pending.values_list("run_id", flat=True):
            engine.execute_run(run_id)
        evaluation = evaluation_refresh(evaluation)
        for side in ("candidate", "baseline"):
            self.stdout.write(json.dumps({"side": side, **evaluation.results[side]}))
