from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from routing import replay
from routing.models import DataClass, Worker
from routing.services import conductor_active, worker_upsert

# Hosted open-model vendors get internal data; the big API vendors public and internal. Operators
# change this per worker; it is a starting point, not a policy.
DATA_CLASSES = [DataClass.PUBLIC, DataClass.INTERNAL]


class Command(BaseCommand):
    help = (
        "Register the replay pool: one worker per model in the recorded-outcomes data (CONDUCTOR_REPLAY_DIR)."
    )

    def handle(self, *args, **options):
        try:
            models = replay.load_models()
        except replay.ReplayDataError as exc:
            raise CommandError(str(exc)) from exc
        actor = Actor.service("load_replay_pool")
        for name, info in sorted(models.items()):
            slug = name.lower()
            fields = {
                "display_name": name,
                "litellm_model": f"replay/{name}",
                "vendor": info["provider"],
                "input_usd_per_mtok": Decimal(str(info["input_usd_per_mtok"])),
                "output_usd_per_mtok": Decimal(str(info["output_usd_per_mtok"])),
                "price_source": Worker.PriceSource.LIST,
                "data_classes": list(DATA_CLASSES),
                # Nothing to tell a conductor beyond its name, vendor and prices (every word of a
                # description is read on every plan).
                "description": "",
            }
            _, created = worker_upsert(slug=slug, fields=fields, actor=actor)
            if options["verbosity"] > 1 or created and options["verbosity"] > 0:
                self.stdout.write(f"{'registered' if created else 'checked'} {slug}")
        version = conductor_active()
        if options["verbosity"] > 0:
            self.stdout.write(
                self.style.SUCCESS(f"{len(models)} replay workers; active conductor {version.name}")
            )
