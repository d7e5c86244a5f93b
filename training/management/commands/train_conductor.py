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
        parser.add_argument("--split", default="train")
        parser.add_argument("--epochs", type=int, default=GRPOConfig.epochs)
        parser.add_argument("--limit", type=int, help="train on the first N items only")
        parser.add_argument("--activate", action="store_true", help="make it the active conductor")

    def handle(self, *args, **o):
        actor = Actor.service("train_conductor")
        try:
            job = job_start(
                name=o["name"],
                backend=TrainingJob.Backend.LEARNED,
                dataset=None,
                options={"split": o["split"], "epochs": o["epochs"], "limit": o["limit"]},
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
        self.stdout.write(
            f"{job.name}: {job.candidate.notes}; {o['epochs']} epochs in {elapsed:.1f}s"
            + (" (active)" if o["activate"] else "")
        )
