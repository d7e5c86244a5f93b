from django.core.management.base import BaseCommand

from audit.seals import SEAL_BATCH, seal_pending


class Command(BaseCommand):
    help = (
        "Append the pending seals of ended runs to the global chain now, a batch at a time, until none "
        "is left (what beat does every AUDIT_SEAL_EVERY_S); prints how many."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=SEAL_BATCH, help="pending seals per transaction")

    def handle(self, *args, **options):
        total = 0
        while True:
            sealed = seal_pending(limit=options["batch"])
            total += sealed
            if sealed < options["batch"]:  # the rest (run ends after it started) are beat's
                break
        self.stdout.write(f"{total} pending seal(s) appended to the global chain")
