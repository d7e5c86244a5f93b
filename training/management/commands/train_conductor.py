from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from routing.services import conductor_activate
from training.models import JobStatus, TrainingJob
from training.policy import GRPOConfig
from training.services import TrainingError, job_start
from training.tasks import train_job


class Command(BaseCommand):
    help = (
        "Train the learned conductor with GRPO on recorded outcomes and register it as a conductor version "
        "(a training job, run here instead of on the training queue)."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="version name, e.g. learned-v1")
        parser.add_argument(
            "--item-set", default="replay", help="the item set (default: the bundled replay benchmark)"
        )
        parser.add_argument("--split", default="train")
        parser.add_argument("--epochs", type=int, default=GRPOConfig.epochs)
        parser.add_argument("--limit", type=int, help="train on the first N items only")
        parser.add_argument(
            "--cost-penalty",
            type=float,
            default=GRPOConfig.cost_penalty_per_usd,
            help="the operating point: reward = correct - penalty x USD (pick it from the frontier)",
        )
        parser.add_argument("--folds", type=int, default=3, help="cross-validation folds (2 to 10)")
        parser.add_argument(
            "--no-frontier", action="store_true", help="cross-validate this penalty only, not the whole grid"
        )
        parser.add_argument("--activate", action="store_true", help="make it the active conductor")

    def handle(self, *args, **o):
        actor = Actor.service("train_conductor")
        try:
            job = job_start(
                name=o["name"],
                backend=TrainingJob.Backend.LEARNED,
                dataset=None,
                options={
                    "item_set": o["item_set"],
                    "split": o["split"],
                    "epochs": o["epochs"],
                    "limit": o["limit"],
                    "cost_penalty_per_usd": o["cost_penalty"],
                    "folds": o["folds"],
                    "frontier": not o["no_frontier"],
                },
                actor=actor,
                queue=False,
            )
        except TrainingError as exc:
            raise CommandError(str(exc)) from exc
        train_job(job.pk)
        job.refresh_from_db()
        if job.status != JobStatus.SUCCEEDED:
            raise CommandError(f"training {job.name} {job.status}: {job.error}")
        if o["activate"]:
            conductor_activate(version=job.candidate, actor=actor)
        elapsed = (job.finished_at - job.started_at).total_seconds()
        frontier = job.candidate.config.get("frontier") or {}
        for point in frontier.get("points", []):
            chosen = " <- this version" if point["cost_penalty_per_usd"] == frontier.get("chosen") else ""
            self.stdout.write(
                f"  penalty {point['cost_penalty_per_usd']:>7g}: accuracy {point['accuracy']:.3f}, "
                f"{point['usd_per_1000']:.2f} USD per 1,000 tasks (cross-validated)"
                f"{' on the frontier' if point['on_frontier'] else ''}{chosen}"
            )
        self.stdout.write(
            f"{job.name}: {job.candidate.notes}; {o['epochs']} epochs in {elapsed:.1f}s"
            + (" (active)" if o["activate"] else "")
        )
