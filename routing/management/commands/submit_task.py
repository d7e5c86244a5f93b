import json
import sys
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from routing.models import DataClass, Task
from routing.services import SubmissionError, TaskSubmission, task_submit


class Command(BaseCommand):
    help = "Submit a task from the command line; prints its id. Reads the text from stdin when it is '-'."
    stealth_options = ("stdin",)  # call_command(..., stdin=...) in tests

    def add_arguments(self, parser):
        parser.add_argument("text")
        parser.add_argument("--reference")
        parser.add_argument("--scorer", default="auto")
        parser.add_argument("--classification", default=DataClass.INTERNAL, choices=DataClass.values)
        parser.add_argument("--max-steps", type=int)
        parser.add_argument("--max-depth", type=int)
        parser.add_argument("--max-usd", type=Decimal)
        parser.add_argument("--idempotency-key")
        parser.add_argument("--json", action="store_true", help="print the task as JSON")

    def handle(self, *args, **o):
        text = (o.get("stdin") or sys.stdin).read() if o["text"] == "-" else o["text"]
        submission = TaskSubmission(
            text=text,
            reference=o["reference"],
            scorer=o["scorer"],
            classification=o["classification"],
            max_steps=o["max_steps"],
            max_depth=o["max_depth"],
            max_usd=o["max_usd"],
            idempotency_key=o["idempotency_key"],
        )
        try:
            task, created = task_submit(submission=submission, source=Task.Source.CLI)
        except SubmissionError as exc:
            raise CommandError(str(exc)) from exc
        if o["json"]:
            self.stdout.write(json.dumps({"id": str(task.pk), "created": created, "status": task.status}))
        else:
            self.stdout.write(f"{task.pk} {'submitted' if created else 'already submitted'}")
