from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from training.tiny_model import TinyModelSpec, make_tiny_model


class Command(BaseCommand):
    help = (
        "Build a tiny randomly initialised Qwen2 model and a tokenizer trained here on conductor prompts: "
        "the base model for running the LLM conductor's LoRA/GRPO training path on a CPU, offline."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "output_dir",
            nargs="?",
            help="where to save it (default: <VAR_DIR>/models/tiny-qwen2)",
        )
        parser.add_argument("--vocab-size", type=int, default=2048, help="upper bound of the BPE vocabulary")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, **o):
        try:  # train extra: checked here, so that the command says what is missing
            import tokenizers  # noqa: F401
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise CommandError(f"needs the train extra (pip install -e '.[train]'): {exc}") from exc
        output_dir = Path(o["output_dir"] or settings.VAR_DIR / "models" / "tiny-qwen2")
        spec = TinyModelSpec(vocab_size=o["vocab_size"], seed=o["seed"])
        path = make_tiny_model(output_dir, spec=spec)
        self.stdout.write(self.style.SUCCESS(f"tiny Qwen2 model and tokenizer saved in {path}"))
