import json

from django.core.management.base import BaseCommand

from audit.verify import verify


class Command(BaseCommand):
    help = (
        "Recompute every audit chain, check it against every signed checkpoint file (the trust anchor "
        "outside the database), check seals and purges, and compare the run rows with their events. "
        "Prints 'intact up to event N' or names the first altered, missing or reordered event; exits 1 "
        "when the record is not intact."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")
        parser.add_argument(
            "--chain",
            action="append",
            help="one run's proof: this chain only, read through indexes (repeatable)",
        )
        parser.add_argument(
            "--checkpoints",
            metavar="DIR",
            help="the signed checkpoint files to trust (default AUDIT_CHECKPOINT_DIR)",
        )
        parser.add_argument(
            "--public-key",
            metavar="PEM",
            help="the public key the checkpoints must verify with (default AUDIT_PUBLIC_KEY_FILE, else the signing key's)",
        )

    def handle(self, *args, **options):
        report = verify(
            chains=options["chain"], checkpoint_dir=options["checkpoints"], public_key=options["public_key"]
        )
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "intact": report.intact,
                        "events": report.events,
                        "chains": report.chains,
                        "last_event_id": report.last_event_id,
                        "checkpoint_id": report.checkpoint_id,
                        "checkpoint_number": report.checkpoint_number,
                        "checkpoints_checked": report.checkpoints_checked,
                        "anchor": report.anchor,
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
