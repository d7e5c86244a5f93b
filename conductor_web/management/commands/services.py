from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connections

from conductor_web import embedded


class Command(BaseCommand):
    help = (
        "Stop what runs under ./var (CONDUCTOR_VAR_DIR): a demo and the web server, Celery workers and beat it "
        "started (whole process groups; SIGKILL after the grace period), then the embedded PostgreSQL and Redis "
        "(used when DATABASE_URL/REDIS_URL are unset)."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["stop"])
        parser.add_argument(
            "--grace", type=float, default=10, help="seconds a process gets to stop before it is killed"
        )

    def handle(self, *args, **options):
        connections.close_all()
        stopped = embedded.stop(settings.VAR_DIR, grace=options["grace"])
        self.stdout.write(f"stopped: {', '.join(stopped) or 'nothing was running'}")
