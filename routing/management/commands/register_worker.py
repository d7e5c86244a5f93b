from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from routing.models import DataClass
from routing.services import SubmissionError, worker_register


class Command(BaseCommand):
    help = "Register or update a worker. Prices come from litellm's local cost map unless both are given."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("litellm_model", help="e.g. openai/gpt-4o-mini or hosted_vllm/qwen2.5-32b")
        parser.add_argument("--vendor", required=True, help="who receives the data")
        parser.add_argument("--api-base", default="")
        parser.add_argument("--api-key-env", default="", help="environment variable holding the API key")
        parser.add_argument("--input-price", type=Decimal, help="USD per 1M input tokens")
        parser.add_argument("--output-price", type=Decimal, help="USD per 1M output tokens")
        parser.add_argument("--context-window", type=int)
        parser.add_argument(
            "--data-classes", default="public,internal", help=f"comma-separated: {DataClass.values}"
        )
        parser.add_argument("--self-hosted", action="store_true")
        parser.add_argument("--region", default="")

    def handle(self, *args, **o):
        try:
            worker, created = worker_register(
                slug=o["slug"],
                litellm_model=o["litellm_model"],
                vendor=o["vendor"],
                actor=Actor.service("register_worker"),
                api_base=o["api_base"],
                api_key_env=o["api_key_env"],
                input_usd_per_mtok=o["input_price"],
                output_usd_per_mtok=o["output_price"],
                context_window=o["context_window"],
                data_classes=[c.strip() for c in o["data_classes"].split(",") if c.strip()],
                self_hosted=o["self_hosted"],
                region=o["region"],
            )
        except SubmissionError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{'registered' if created else 'updated'} {worker.slug}: ${worker.input_usd_per_mtok} / "
            f"${worker.output_usd_per_mtok} per 1M tokens ({worker.get_price_source_display()})"
        )
