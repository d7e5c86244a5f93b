import random

from django.core.management.base import BaseCommand, CommandError

from routing import replay
from routing.models import Task
from routing.services import TaskSubmission, task_submit


class Command(BaseCommand):
    help = "Submit recorded benchmark items as tasks (with their reference answers) for the replay pool."

    def add_arguments(self, parser):
        parser.add_argument("--split", default="dev")
        parser.add_argument("--count", type=int, default=20)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--domain", help="only items of this domain (gsm8k, math-l5, cruxeval-o)")
        parser.add_argument(
            "--prefix", default="replay", help="idempotency-key prefix; a rerun submits nothing twice"
        )

    def handle(self, *args, **o):
        try:
            items = replay.read_items(replay.split_path(o["split"]))
        except replay.ReplayDataError as exc:
            raise CommandError(str(exc)) from exc
        if o["domain"]:
            items = [i for i in items if i.domain == o["domain"]]
        random.Random(o["seed"]).shuffle(items)
        submitted = 0
        for item in items[: o["count"]]:
            _, created = task_submit(
                submission=TaskSubmission.of_replay(
                    item, idempotency_key=f"{o['prefix']}:{o['split']}:{item.id}"
                ),
                source=Task.Source.CLI,
            )
            submitted += created
        if o["verbosity"] > 0:
            self.stdout.write(
                self.style.SUCCESS(f"submitted {submitted} of {min(len(items), o['count'])} items")
            )
