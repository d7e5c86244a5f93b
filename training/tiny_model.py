"""A tiny, randomly initialised Qwen2 conductor and a tokenizer trained here: the training path offline.

The real conductor is Qwen2.5-7B on a GPU. Its training code path (TRL's GRPOTrainer + a LoRA
adapter, training.lora) runs unchanged on a CPU against this model: same architecture class, a
byte-level BPE tokenizer trained locally on conductor prompts and plans, and a ChatML chat template
like Qwen's. Nothing is downloaded; the weights are random, so what it writes is noise, not plans.

Needs the `train` extra (torch, transformers, tokenizers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from routing.conductors import LLMConductor, PlanRequest, WorkerCard

# Qwen's special tokens (S105: vocabulary entries, not secrets).
BOS_TOKEN = "<|endoftext|>"  # noqa: S105
EOS_TOKEN = "<|im_end|>"  # noqa: S105 - ends an assistant turn, as in Qwen's chat format
PAD_TOKEN = "<|endoftext|>"  # noqa: S105
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen's ChatML, without tools: enough for apply_chat_template(..., add_generation_prompt=True).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def offline() -> None:
    """Forbid Hugging Face hub access in this process (also when huggingface_hub is already imported)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        import huggingface_hub.constants as hub_constants  # train extra: production installs may lack it
    except ImportError:  # pragma: no cover - the train extra brings huggingface_hub
        return
    hub_constants.HF_HUB_OFFLINE = True


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 2048
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    seed: int = 0


def conductor_corpus() -> list[str]:
    """Texts to train the tokenizer on: conductor prompts (as the LLM conductor writes them) and plans.

    Uses routing.conductors (Django models are imported, so Django must be set up).
    """

    workers = [
        WorkerCard("gpt-4o-mini-2024-07-18", "openai", "fast and cheap", Decimal("0.15"), Decimal("0.60")),
        WorkerCard("gpt-4o-2024-08-06", "openai", "strong generalist", Decimal("2.50"), Decimal("10.00")),
        WorkerCard("gemini-1.5-flash", "google", "", Decimal("0.075"), Decimal("0.30")),
        WorkerCard(
            "claude-3-5-sonnet-20240620", "anthropic", "careful reasoning", Decimal("3"), Decimal("15")
        ),
        WorkerCard("qwen2-72b-instruct", "alibaba", "open weights", Decimal("0.90"), Decimal("0.90")),
    ]
    tasks = [
        ("What is the derivative of x^3 + 2x?", "math"),
        ("Find all real x such that x^2 - 5x + 6 = 0.", "math-l5"),
        ("def f(s):\n    return s[::-1] + s\nassert f('ab') == ??", "cruxeval-o"),
        ("Which gas do plants absorb? (A) O2 (B) CO2 (C) N2 (D) H2", "mmlu"),
    ]
    conductor = LLMConductor({"model": "tiny"})
    texts: list[str] = []
    for i, (task, domain) in enumerate(tasks):
        request = PlanRequest(
            task_text=task, domain=domain, workers=workers, max_steps=5, may_recurse=bool(i % 2)
        )
        texts += [m["content"] for m in conductor.messages(request)]
        plan = {
            "thought": "A cheap worker answers; a strong one checks.",
            "steps": [
                {"worker": workers[i % len(workers)].slug, "instruction": task, "access": []},
                {"worker": workers[1].slug, "instruction": "Check the answer above.", "access": "all"},
            ],
        }
        texts.append(json.dumps(plan))
    return texts


def build_tokenizer(texts: Iterable[str], *, vocab_size: int = 2048) -> Any:
    """A byte-level BPE tokenizer trained on `texts`, wrapped for transformers, with a chat template.

    Byte-level: any text (any script, any byte) encodes, however small the training corpus.
    """
    # tokenizers, transformers: heavy; imported only when a tiny model is made
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    if not texts:
        raise ValueError("build_tokenizer needs at least one training text")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        model_max_length=TinyModelSpec.max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: Any, spec: TinyModelSpec | None = None) -> Any:
    """A randomly initialised Qwen2ForCausalLM sized by `spec`, its vocabulary that of `tokenizer`."""
    # torch, transformers: heavy; imported only when a tiny model is made
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinyModelSpec()
    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
    )
    return model


def make_tiny_model(
    output_dir: str | Path, *, texts: Iterable[str] | None = None, spec: TinyModelSpec | None = None
) -> Path:
    """Train a tokenizer, build the tiny model, save both (save_pretrained) into `output_dir`.

    `texts` defaults to conductor_corpus() (needs Django set up). Returns the directory, which
    AutoTokenizer / AutoModelForCausalLM.from_pretrained and training.lora.run_grpo_lora accept.
    """
    offline()
    spec = spec or TinyModelSpec()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(conductor_corpus() if texts is None else texts, vocab_size=spec.vocab_size)
    model = build_model(tokenizer, spec)
    tokenizer.save_pretrained(output_dir)
    model.save_pretrained(output_dir)
    (output_dir / "tiny_model_spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return output_dir
