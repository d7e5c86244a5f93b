import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from conductor_web import local_model
from routing.local_pool import local_model_register


class Command(BaseCommand):
    help = (
        "The local model (SmolLM2-135M-Instruct on llama.cpp's server, under ./var): `up` installs it when "
        "it is missing (the server's wheel is built once per machine and kept in the user's cache folder), "
        "starts its server unless it answers, and registers it as a worker (vendor local, $0, weak) and as "
        "an llm conductor; `status` and `stop` say and stop. `manage.py services stop` stops it too."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["up", "status", "stop"])
        parser.add_argument(
            "--no-install", action="store_true", help="fail instead of installing what is missing"
        )

    def handle(self, *args, action: str, **options):
        var_dir = settings.VAR_DIR
        if action == "status":
            state = local_model.state_read(var_dir) or {"state": "never started"}
            self.stdout.write(" ".join(f"{k}={v}" for k, v in state.items()))
            return
        if action == "stop":
            stopped = local_model.stop(var_dir)
            self.stdout.write("stopped" if stopped else "it was not running")
            return
        try:
            if not local_model.server_installed():
                if options["no_install"]:
                    raise local_model.LocalModelError("the local model is not installed")
                local_model.state_write(var_dir, "installing")
                local_model.install(
                    var_dir,
                    log=sys.stdout,
                    progress=lambda step: local_model.state_write(var_dir, "installing", step=step),
                )
            api_base = local_model.start(var_dir, port=settings.LOCAL_MODEL_PORT)
        except (local_model.LocalModelError, OSError) as exc:
            local_model.state_write(var_dir, "failed", reason=str(exc))
            raise CommandError(str(exc)) from exc
        except Exception as exc:  # a failed pip, above all: said on the overview, then raised
            local_model.state_write(var_dir, "failed", reason=f"{type(exc).__name__}: {exc}")
            raise
        worker, version = local_model_register(api_base=api_base, actor=Actor.service("local_model"))
        self.stdout.write(
            self.style.SUCCESS(
                f"local model up at {api_base}: worker {worker.slug}, llm conductor {version.name}"
            )
        )
