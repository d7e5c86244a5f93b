"""Forms of the ML-staff pages: they check the input; the services in training.services act on it."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings

from routing.limits import NAME_MAX_CHARS, NAME_RULE, name_check
from routing.models import ConductorVersion

from . import quotas
from .itemsets.selectors import REPLAY_SET, set_names
from .local_base import local_base_available, local_base_dir
from .models import Dataset, RolloutBatch, TrainingJob
from .services import (
    LEARNED_DEFAULTS,
    LEARNED_LIMITS,
    LORA_DEFAULTS,
    LORA_LIMITS,
    MAX_ITEMS,
    MAX_K,
    MAX_TEMPERATURE,
    ROLLOUT_DEFAULTS,
    ROLLOUT_TEMPERATURE_HELP,
    rollout_temperature,
)

SPLITS = [("train", "train"), ("dev", "dev"), ("test", "test")]


class ItemSetChoiceField(forms.ChoiceField):
    """The item sets a form offers: the team's, then the bundled replay benchmark (read when the form
    is made, so a set uploaded a moment ago is there). Left out: the replay benchmark."""

    def clean(self, value: Any) -> str:
        return super().clean(value) or REPLAY_SET


def item_set_field(**kwargs: Any) -> forms.ChoiceField:
    return ItemSetChoiceField(
        choices=lambda: [(n, n if n != REPLAY_SET else f"{n} (the bundled benchmark)") for n in set_names()],
        initial=REPLAY_SET,
        required=False,
        label="Item set",
        **kwargs,
    )


def money_field(**kwargs: Any) -> forms.DecimalField:
    return forms.DecimalField(
        min_value=Decimal("0"), max_digits=20, decimal_places=6, required=False, **kwargs
    )


def default_base_model_path() -> str:
    """The local model (SmolLM2-135M-Instruct) where it is installed, else the tiny test model."""
    if local_base_available():
        return str(local_base_dir())
    return str(settings.VAR_DIR / "models" / "tiny-qwen2")


def name_field(help_text: str) -> forms.CharField:
    """A training job's or dataset's name: routing.limits.NAME_PATTERN, with its message (the API and
    the services refuse the same names with the same words)."""
    return forms.CharField(
        validators=[name_check],
        help_text=f"{help_text}. {NAME_RULE}",
        widget=forms.TextInput(attrs={"maxlength": NAME_MAX_CHARS}),
    )


def _bounded(
    bounds: dict[str, tuple[type, float, float]], defaults: dict[str, Any], key: str, **kwargs: Any
) -> forms.Field:
    """A number field with the service's bounds (training.services.*_LIMITS) and default."""
    kind, low, high = bounds[key]
    field = forms.IntegerField if kind is int else forms.FloatField
    return field(min_value=low, max_value=high, initial=defaults.get(key), **kwargs)


class VersionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: ConductorVersion) -> str:
        flags = " (active)" if obj.is_active else " (shadow)" if obj.is_shadow else ""
        return f"{obj.name} · {obj.backend}{flags}"


class DatasetChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Dataset) -> str:
        warning = " (nothing to learn)" if obj.teaches_nothing else ""
        return f"{obj.name} v{obj.version}" + (f" · {obj.signal}{warning}" if obj.signal else "")


class BatchChoiceField(forms.ModelMultipleChoiceField):
    def label_from_instance(self, obj: RolloutBatch) -> str:
        return f"#{obj.pk} · {obj.conductor_version.name} · K={obj.k} · {len(obj.items)} items · {obj.status}"


class JobStartForm(forms.Form):
    """Launch a training job. The learned policy trains on a replay split (or a dataset); the LLM
    conductor (LoRA) needs a dataset."""

    prefix = "job"

    name = name_field("The candidate conductor version this job registers")
    backend = forms.ChoiceField(choices=TrainingJob.Backend.choices, initial=TrainingJob.Backend.LEARNED)
    dataset = DatasetChoiceField(
        queryset=Dataset.objects.order_by("-created_at", "-id"),
        required=False,
        empty_label="— none: train on a replay split —",
    )
    item_set = item_set_field(help_text="Without a dataset: the set it trains on")
    split = forms.ChoiceField(choices=SPLITS, initial="train", label="Split")
    limit = _bounded(LEARNED_LIMITS, {}, "limit", required=False, help_text="First N items only (empty: all)")
    # The learned policy (GRPO on the CPU); bounds and defaults are the service's
    epochs = _bounded(LEARNED_LIMITS, LEARNED_DEFAULTS, "epochs")
    learning_rate = _bounded(LEARNED_LIMITS, LEARNED_DEFAULTS, "learning_rate")
    group_size = _bounded(LEARNED_LIMITS, LEARNED_DEFAULTS, "group_size", label="Group size")
    cost_penalty_per_usd = _bounded(
        LEARNED_LIMITS, LEARNED_DEFAULTS, "cost_penalty_per_usd", label="Cost penalty per USD"
    )
    # The LLM conductor (TRL GRPO + LoRA)
    base_model_path = forms.CharField(
        max_length=500,
        required=False,
        label="Base model path",
        help_text="A local directory (transformers' save_pretrained). The local model's, SmolLM2-135M-Instruct, "
        "is made from its server's weights by the job; an adapter trained on it is served by that server.",
    )
    max_steps = _bounded(LORA_LIMITS, LORA_DEFAULTS, "max_steps", label="Max steps")
    num_generations = _bounded(LORA_LIMITS, LORA_DEFAULTS, "num_generations", label="Generations per prompt")
    prompts_per_step = _bounded(LORA_LIMITS, LORA_DEFAULTS, "prompts_per_step", label="Prompts per step")
    max_completion_length = _bounded(
        LORA_LIMITS, LORA_DEFAULTS, "max_completion_length", label="Max tokens per plan"
    )
    lora_learning_rate = _bounded(LORA_LIMITS, LORA_DEFAULTS, "learning_rate", label="Learning rate")
    lora_r = _bounded(LORA_LIMITS, LORA_DEFAULTS, "lora_r", label="LoRA rank r")
    allow_no_signal = forms.BooleanField(
        required=False,
        label="Train even if no group of the dataset carries a learning signal",
        help_text="Such a job is refused otherwise: every advantage is 0, so it would learn nothing",
    )

    LEARNED_FIELDS = (
        "item_set",
        "split",
        "limit",
        "epochs",
        "learning_rate",
        "group_size",
        "cost_penalty_per_usd",
    )
    LORA_FIELDS = (
        "base_model_path",
        "max_steps",
        "num_generations",
        "prompts_per_step",
        "max_completion_length",
        "lora_learning_rate",
        "lora_r",
        "allow_no_signal",
    )

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["base_model_path"].initial = default_base_model_path()
        # Only the chosen backend's settings matter: the other backend's may be left empty.
        for name in (*self.LEARNED_FIELDS, *self.LORA_FIELDS):
            self.fields[name].required = False

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if ConductorVersion.objects.filter(name=name).exists():
            raise forms.ValidationError("A conductor version of this name exists; choose another name.")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        backend = data.get("backend")
        if backend == TrainingJob.Backend.LEARNED:
            self._require(data, ("split", "epochs", "learning_rate", "group_size", "cost_penalty_per_usd"))
        elif backend == TrainingJob.Backend.LLM_LORA:
            self._require(data, self.LORA_FIELDS)
            if not data.get("dataset"):
                self.add_error("dataset", "The LLM conductor trains on a dataset: build one first.")
        return data

    def _require(self, data: dict[str, Any], names: tuple[str, ...]) -> None:
        for name in names:
            if name not in self.errors and data.get(name) in (None, ""):
                self.add_error(name, "This field is required for this backend.")

    def options(self) -> dict[str, Any]:
        """The backend's settings, as training.services.job_start takes them."""
        data = self.cleaned_data
        if data["backend"] == TrainingJob.Backend.LEARNED:
            return {
                "item_set": data["item_set"],
                "split": data["split"],
                "limit": data.get("limit"),
                "epochs": data["epochs"],
                "learning_rate": data["learning_rate"],
                "group_size": data["group_size"],
                "cost_penalty_per_usd": data["cost_penalty_per_usd"],
            }
        return {
            "base_model_path": data["base_model_path"],
            "max_steps": data["max_steps"],
            "num_generations": data["num_generations"],
            "prompts_per_step": data["prompts_per_step"],
            "max_completion_length": data["max_completion_length"],
            "learning_rate": data["lora_learning_rate"],
            "lora_r": data["lora_r"],
            "allow_no_signal": data["allow_no_signal"],
        }


class TemperatureInput(forms.NumberInput):
    """The rollout temperature, with each version's default (rollout_temperature) in data-defaults, read
    when the form is drawn: static/js/training.js shows the chosen version's as the placeholder; the
    service applies the same default to an empty field."""

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        versions = ConductorVersion.objects.values_list("pk", "backend")
        defaults = {str(pk): rollout_temperature(backend) for pk, backend in versions}
        context["widget"]["attrs"]["data-defaults"] = json.dumps(defaults)
        return context


class RolloutsForm(forms.Form):
    """Sample K workflows per item of a set from a conductor version (the GRPO groups), or survey the
    workers (each answers every item once: what the learned policy learns from on a team's items)."""

    prefix = "rollouts"

    version = VersionChoiceField(queryset=ConductorVersion.objects.order_by("-created_at"), label="Version")
    item_set = item_set_field()
    split = forms.ChoiceField(choices=SPLITS, initial="train", label="Split")
    domain = forms.CharField(
        max_length=40, required=False, label="Kind", help_text="Only this kind (empty: all)"
    )
    survey = forms.BooleanField(
        required=False,
        label="Survey the workers",
        help_text="Every worker the items' policies allow answers each item once (K and the version are not used)",
    )
    limit = forms.IntegerField(
        min_value=1, max_value=MAX_ITEMS, initial=ROLLOUT_DEFAULTS["limit"], help_text="Items"
    )
    k = forms.IntegerField(
        min_value=1, max_value=MAX_K, initial=ROLLOUT_DEFAULTS["k"], label="K", help_text="Samples per item"
    )
    temperature = forms.FloatField(
        min_value=0.0,
        max_value=MAX_TEMPERATURE,
        required=False,
        help_text=ROLLOUT_TEMPERATURE_HELP,
        widget=TemperatureInput(attrs={"placeholder": "the conductor's default"}),
    )
    max_usd = money_field(
        label="Budget (USD)", help_text="Refused if the estimate is above it (empty: no budget)"
    )
    shown_usd = money_field(widget=forms.HiddenInput)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("limit") and data.get("k"):
            try:  # the items asked for x K (the split may have fewer: the service counts those)
                quotas.rollout_runs_check(data["limit"], data["k"])
            except forms.ValidationError as exc:
                self.add_error(None, exc)
        return data


class DatasetBuildForm(forms.Form):
    """Build a versioned GRPO dataset from rollouts."""

    prefix = "dataset"

    name = name_field("Building the same name again makes its next version")
    batches = BatchChoiceField(
        queryset=RolloutBatch.objects.select_related("conductor_version").order_by("-created_at", "-id"),
        required=False,
        help_text="Rollout batches to take (none: every batch)",
    )
    conductor_version = VersionChoiceField(
        queryset=ConductorVersion.objects.order_by("-created_at"),
        required=False,
        label="Conductor version",
        help_text="Only rollouts sampled from this version (none: any)",
    )
    since = forms.DateTimeField(required=False, help_text="Rollouts run from (e.g. 2026-11-01 00:00)")
    until = forms.DateTimeField(required=False, help_text="…and before")
    items = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Item ids, one per line or comma-separated (none: all)",
    )
    min_group_size = forms.IntegerField(min_value=1, max_value=1024, initial=2, label="Min group size")
    correctness = forms.FloatField(
        min_value=0.0, max_value=1000.0, initial=1.0, required=False, label="Correctness weight"
    )
    cost_penalty_per_usd = forms.FloatField(
        min_value=0.0, max_value=1_000_000.0, initial=0.0, label="Cost penalty per USD"
    )
    format_term = forms.BooleanField(
        required=False, label="Format term (0 unparseable plan, 0.5 parsed but wrong, 1 correct)"
    )
    human_labels = forms.BooleanField(
        required=False,
        label="Human labels first (a reviewer's verdict on a run, where there is one, in place of its score)",
    )
    validation_fraction = forms.FloatField(
        min_value=0.0, max_value=0.9, initial=0.1, label="Validation fraction"
    )

    def clean_items(self) -> list[str] | None:
        raw = self.cleaned_data.get("items") or ""
        ids = [part.strip() for chunk in raw.splitlines() for part in chunk.split(",") if part.strip()]
        return ids or None


class EvaluateForm(forms.Form):
    """Evaluate a candidate against a baseline (the active version unless another is chosen, such as
    the base model a candidate was trained from) on held-out items."""

    item_set = item_set_field()
    split = forms.ChoiceField(choices=SPLITS, initial="dev")
    limit = forms.IntegerField(min_value=1, max_value=10_000, initial=100)
    max_usd = money_field(label="Budget (USD)")
    shown_usd = money_field(widget=forms.HiddenInput)
    baseline = VersionChoiceField(
        queryset=ConductorVersion.objects.order_by("-created_at"), required=False, label="Baseline"
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("limit"):
            try:  # the split's size is the service's check (it reads the split)
                quotas.evaluation_runs_check(data["limit"])
            except forms.ValidationError as exc:
                self.add_error(None, exc)
        return data
