import time

from django.core.management.base import BaseCommand

from routing import folds


class Command(BaseCommand):
    help = (
        "Recount the rollups the aggregate pages read (analytics, the vendor report) from the rows of "
        "every finished run. They are kept as runs finish; run this after loading rows by other means."
    )

    def handle(self, *args, **o):
        started = time.perf_counter()
        counts = folds.rebuild()
        took = time.perf_counter() - started
        rows = ", ".join(f"{name} {n:,}" for name, n in counts.items())
        self.stdout.write(f"rollups rebuilt in {took:.1f} s: {rows} rows")
