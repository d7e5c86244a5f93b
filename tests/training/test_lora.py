"""The LLM conductor's training path: GRPO + LoRA on a tiny random Qwen2, on the CPU, offline."""

from __future__ import annotations

import io
import json
import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from django.core.management import call_command  # noqa: E402

from routing.plans import workflow_schema  # noqa: E402
from training.lora import (  # noqa: E402
    _grpo_config,
    _settings,
    completion_text,
    format_reward,
    run_grpo_lora,
)
from training.rewards import FORMAT_TERM_PARSED  # noqa: E402

TRAIN_SETTINGS = {
    "num_generations": 2,
    "prompts_per_step": 2,
    "max_completion_length": 12,
    "max_steps": 3,
    "learning_rate": 1e-3,
    "torch_threads": 2,
}

PLAN = {
    "thought": "one cheap worker",
    "steps": [
        {"worker": "alpha", "instruction": "What is 2 + 2?", "access": []},
        {"worker": "beta", "instruction": "Check it.", "access": "all"},
    ],
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch.set_num_threads(2)
    path = tmp_path_factory.mktemp("models") / "tiny-qwen2"
    call_command("make_tiny_model", str(path), stdout=io.StringIO())
    return path


def _dataset() -> Dataset:
    rows = []
    for i in range(4):
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": "You are the conductor. Answer with a JSON workflow."},
                    {"role": "user", "content": f"Task:\nWhat is {i} + {i}?"},
                ],
                "item": f"item-{i}",
                "reference": str(2 * i),
                "domain": "math",
                "allowed_workers": ["alpha", "beta"],
            }
        )
    return Dataset.from_list(rows)


class CountingReward:
    """A TRL reward function that records what it was given."""

    __name__ = "counting_reward"

    def __init__(self):
        self.calls = 0
        self.kwargs_seen: set[str] = set()

    def __call__(self, prompts, completions, **kwargs):
        self.calls += 1
        self.kwargs_seen |= set(kwargs)
        assert len(prompts) == len(completions)
        return [float(len(completion_text(c)) % 3) for c in completions]


def test_tokenizer_chat_template_renders_a_conversation(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)
    messages = [
        {"role": "system", "content": "You are the conductor."},
        {"role": "user", "content": "Task:\nWhat is 17 * 24?"},
        {"role": "assistant", "content": json.dumps(PLAN)},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are the conductor.<|im_end|>\n<|im_start|>user\n")
    assert json.dumps(PLAN) + "<|im_end|>" in text
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer(prompt)["input_ids"]
    assert tokenizer.decode(ids) == prompt  # byte-level BPE round-trips
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.decode(tokenizer("héllo, 世界 {}")["input_ids"]) == "héllo, 世界 {}"
    assert 256 < len(tokenizer) <= 2048


def test_grpo_lora_trains_and_saves_a_loadable_adapter(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    counting = CountingReward()
    logs: list[tuple[int, int, dict]] = []

    def on_log(step, total, metrics):
        logs.append((step, total, metrics))
        return True

    result = run_grpo_lora(
        base_model_path=tiny_model,
        train_dataset=_dataset(),
        output_dir=tmp_path / "adapter",
        reward_funcs=[format_reward, counting],
        settings=TRAIN_SETTINGS,
        on_log=on_log,
    )
    assert result["global_step"] == 3 and result["max_steps"] == 3 and not result["stopped_early"]
    assert counting.calls == 3  # one generation batch per step
    assert {"item", "reference", "domain", "allowed_workers"} <= counting.kwargs_seen
    steps = [step for step, _, _ in logs]
    assert steps == [1, 2, 3]
    assert all(total == 3 for _, total, _ in logs)
    for _, _, metrics in logs:
        assert "reward" in metrics and "loss" in metrics
        assert "rewards/format_reward/mean" in metrics and "rewards/counting_reward/mean" in metrics
    assert "train_loss" in result["train_metrics"]

    adapter = tmp_path / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").is_file()
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert set(config["target_modules"]) >= {"q_proj", "v_proj"} and config["peft_type"] == "LORA"
    base = AutoModelForCausalLM.from_pretrained(tiny_model, local_files_only=True)
    model = PeftModel.from_pretrained(base, adapter)
    lora_params = [name for name, _ in model.named_parameters() if "lora_" in name]
    assert lora_params
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] <= 6


def test_on_log_returning_false_stops_training(tiny_model, tmp_path):
    steps: list[int] = []

    def on_log(step, total, metrics):
        steps.append(step)
        return False  # cancel at the first log

    result = run_grpo_lora(
        base_model_path=tiny_model,
        train_dataset=_dataset(),
        output_dir=tmp_path / "adapter",
        reward_funcs=[format_reward],
        settings=TRAIN_SETTINGS,
        on_log=on_log,
    )
    assert steps == [1]
    assert result["global_step"] == 1 < result["max_steps"] == 3
    assert result["stopped_early"]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()  # what was trained is kept


def test_run_grpo_lora_needs_a_local_model(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_grpo_lora(
            base_model_path=tmp_path / "nothing",
            train_dataset=_dataset(),
            output_dir=tmp_path / "out",
            reward_funcs=[format_reward],
            settings=TRAIN_SETTINGS,
        )


def test_completion_text_reads_conversational_and_plain_completions():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "chat"}]) == "chat"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "parts"}]}]) == "parts"
    assert completion_text({"role": "assistant", "content": "one message"}) == "one message"
    assert completion_text(None) == "" and completion_text([]) == ""


def test_format_reward_scores_parsable_plans():
    good = json.dumps(PLAN)
    completions = [
        [{"role": "assistant", "content": good}],
        good,
        f"```json\n{good}\n```",
        "not a plan",
        [{"role": "assistant", "content": json.dumps({**PLAN, "steps": []})}],
        json.dumps({"thought": "", "steps": [{"worker": "alpha", "instruction": "x", "access": [0]}]}),
    ]
    assert format_reward(completions) == [FORMAT_TERM_PARSED] * 3 + [0.0] * 3
    # with allowed workers per row, a plan naming another worker does not parse
    assert format_reward([good, good], allowed_workers=[["alpha", "beta"], ["alpha"]]) == [
        FORMAT_TERM_PARSED,
        0.0,
    ]
    assert format_reward([good], allowed_workers=[json.dumps(["alpha", "beta"])]) == [FORMAT_TERM_PARSED]
    assert format_reward([good], max_steps=[1]) == [0.0]
    bad_slug = json.dumps(
        {"thought": "", "steps": [{"worker": "Not A Slug", "instruction": "x", "access": []}]}
    )
    assert format_reward([bad_slug]) == [0.0]


def test_grpo_config_cpu_defaults_and_vllm_server_mode(tmp_path):
    config = _grpo_config(_settings(TRAIN_SETTINGS), tmp_path, cuda=False)
    assert config.use_cpu and not config.bf16 and not config.use_vllm
    assert config.num_generations == 2 and config.max_completion_length == 12 and config.max_steps == 3
    assert config.logging_steps == 1 and config.report_to in ([], "none", ["none"])
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == 4
    vllm = _grpo_config(
        _settings(
            {
                **TRAIN_SETTINGS,
                "use_vllm": True,
                "vllm_server_base_url": "http://127.0.0.1:8000",
                "use_cpu": True,
            }
        ),
        tmp_path,
        cuda=False,
    )
    assert vllm.use_vllm and vllm.vllm_mode == "server"
    assert vllm.vllm_server_base_url == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="vllm_server_base_url"):
        _grpo_config(_settings({**TRAIN_SETTINGS, "use_vllm": True}), tmp_path, cuda=False)
    with pytest.raises(ValueError, match="unknown training settings"):
        _settings({"num_generation": 2})


def test_samples_are_drawn_under_the_workflow_schema(tiny_model, tmp_path):
    """A randomly initialised model writes no workflow by itself; under the schema, every sample that
    ends within its tokens has the workflow's shape, naming only the schema's workers."""
    sampled: list[str] = []

    def recording(prompts, completions, **kwargs):
        sampled.extend(completion_text(c) for c in completions)
        return format_reward(completions, **kwargs)

    recording.__name__ = "recording"
    schema = workflow_schema(["alpha", "beta"], max_steps=1, min_steps=1, max_text_chars=6)
    settings = {**TRAIN_SETTINGS, "max_steps": 2, "max_completion_length": 160}
    run_grpo_lora(
        base_model_path=tiny_model,
        train_dataset=_dataset(),
        output_dir=tmp_path / "free",
        reward_funcs=[recording],
        settings=settings,
    )
    free = list(sampled)
    sampled.clear()
    run_grpo_lora(
        base_model_path=tiny_model,
        train_dataset=_dataset(),
        output_dir=tmp_path / "schema",
        reward_funcs=[recording],
        settings={**settings, "structured_output_schema": schema},
    )
    assert len(free) == len(sampled) == 8
    assert format_reward(free, allowed_workers=[["alpha", "beta"]] * 8) == [0.0] * 8
    # The ones that ended (xgrammar lets control characters into strings, which the plan parser refuses).
    plans = [json.loads(text, strict=False) for text in sampled if text.endswith("}")]
    assert len(plans) >= 6, sampled
    for plan in plans:
        assert set(plan) == {"thought", "steps"} and len(plan["steps"]) == 1
        assert plan["steps"][0]["worker"] in {"alpha", "beta"} and len(plan["thought"]) <= 6
    with pytest.raises(ValueError, match="use_vllm"):
        run_grpo_lora(
            base_model_path=tiny_model,
            train_dataset=_dataset(),
            output_dir=tmp_path / "vllm",
            reward_funcs=[recording],
            settings={**settings, "structured_output_schema": schema, "use_vllm": True},
        )
