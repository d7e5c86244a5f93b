from django.conf import settings
from django.core.management.base import BaseCommand

from conductor_web import embedded


class Command(BaseCommand):
    help = "Stop the embedded PostgreSQL and Redis started under ./var (used when DATABASE_URL/REDIS_URL are unset)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["stop"])

    def handle(self, *args, **options):
        from django.db import connections

        connections.close_all()
        stopped = embedded.stop(settings.VAR_DIR)
        self.stdout.write(f"stopped: {', '.join(stopped) or 'nothing was running'}")
