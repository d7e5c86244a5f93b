import json

from django.core.management.base import BaseCommand

from audit.verify import verify


class Command(BaseCommand):
    help = (
        "Recompute every audit chain and check the latest signed checkpoint. Prints 'intact up to event N' "
        "or names the first altered, missing or reordered event; exits 1 when the record is not intact."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--chain", action="append", help="verify only this chain (repeatable)")

    def handle(self, *args, **options):
        report = verify(chains=options["chain"])
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "intact": report.intact,
                        "events": report.events,
                        "chains": report.chains,
                        "last_event_id": report.last_event_id,
                        "checkpoint_id": report.checkpoint_id,
                        "problems": [p.__dict__ for p in report.problems],
                    }
                )
            )
        else:
            for problem in report.problems:
                self.stderr.write(problem.sentence())
            self.stdout.write(report.summary())
        if not report.intact:
            raise SystemExit(1)
