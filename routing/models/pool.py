"""The worker pool and the conductor versions: who may be given work, and who plans it."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from ..limits import name_check
from ..secrets import SECRET_CONFIG_KEYS, key_env_check
from .money import USD


class DataClass(models.TextChoices):
    PUBLIC = "public", "Public"
    INTERNAL = "internal", "Internal"
    CONFIDENTIAL = "confidential", "Confidential"
    RESTRICTED = "restricted", "Restricted"


def default_data_classes() -> list[str]:
    return [DataClass.PUBLIC, DataClass.INTERNAL]


SLUG_VALIDATOR = RegexValidator(r"^[a-z0-9][a-z0-9._-]*$", "lower-case letters, digits, '.', '_' and '-'")


class Worker(models.Model):
    """A model that can be given subtasks. Called through litellm by its model string."""

    class PriceSource(models.TextChoices):
        LITELLM = "litellm", "litellm cost map"
        OVERRIDE = "override", "Set by an operator"
        LIST = "list", "Vendor list price (replay data)"

    slug = models.CharField(max_length=80, unique=True, validators=[SLUG_VALIDATOR])
    display_name = models.CharField(max_length=120)
    litellm_model = models.CharField(
        max_length=200, help_text="e.g. openai/gpt-4o-mini, replay/gpt-4o-mini-2024-07-18"
    )
    api_base = models.URLField(max_length=500, blank=True)
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        validators=[key_env_check],
        help_text="Name of the environment variable holding the API key: CONDUCTOR_KEY_<NAME>",
    )
    vendor = models.CharField(
        max_length=80, help_text="Who receives the data: openai, anthropic, self-hosted..."
    )
    region = models.CharField(max_length=40, blank=True)
    self_hosted = models.BooleanField(default=False)
    input_usd_per_mtok = models.DecimalField(**USD)
    output_usd_per_mtok = models.DecimalField(**USD)
    price_source = models.CharField(max_length=20, choices=PriceSource.choices, default=PriceSource.LITELLM)
    context_window = models.PositiveIntegerField(default=128_000)
    enabled = models.BooleanField(default=True)
    data_classes = ArrayField(
        models.CharField(max_length=20, choices=DataClass.choices),
        default=default_data_classes,
        help_text="Classifications of data this worker may receive",
    )
    description = models.TextField(blank=True, help_text="Shown to the conductor when it picks workers")
    weak = models.BooleanField(
        default=False,
        help_text="A demo-grade model (the local 135M one): its answers are labelled weak wherever they are shown",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def cost_of(self, *, input_tokens: int, output_tokens: int) -> Decimal:
        per_token = Decimal(1_000_000)
        return (
            Decimal(input_tokens) * self.input_usd_per_mtok / per_token
            + Decimal(output_tokens) * self.output_usd_per_mtok / per_token
        )


class ConductorVersion(models.Model):
    class Backend(models.TextChoices):
        STATIC = "static", "Static rules"
        LLM = "llm", "LLM (OpenAI-compatible endpoint)"
        LEARNED = "learned", "Learned policy"

    name = models.SlugField(max_length=80, unique=True, validators=[name_check])  # ASCII: no look-alikes
    backend = models.CharField(max_length=20, choices=Backend.choices)
    config = models.JSONField(default=dict, blank=True)
    is_active = models.BooleanField(default=False)
    is_shadow = models.BooleanField(
        default=False, help_text="Plans the same live tasks as the active version, without affecting them"
    )
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_active"], condition=Q(is_active=True), name="one_active_conductor"
            ),
            models.UniqueConstraint(
                fields=["is_shadow"], condition=Q(is_shadow=True), name="one_shadow_conductor"
            ),
            models.CheckConstraint(
                condition=~(Q(is_active=True) & Q(is_shadow=True)), name="shadow_is_not_active"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.backend})"

    def clean(self) -> None:
        if not isinstance(self.config, dict):
            raise ValidationError({"config": "a JSON object"})
        try:
            key_env_check(str(self.config.get("api_key_env") or ""))
        except ValidationError as exc:
            raise ValidationError({"config": exc.messages}) from exc
        literal = sorted(k for k in self.config if k in SECRET_CONFIG_KEYS)
        if literal:  # it would be stored, shown and audited for good
            raise ValidationError(
                {
                    "config": f"a key is never written in the config ({', '.join(literal)}): name its variable in api_key_env"
                }
            )
