"""The limits of a task submission, in one place: the web form, the API and the service check the same
values with the same messages, so a value one path refuses is refused by the others too. The plan's
limits (routing.plans) are here too and follow them: a step's instruction may quote any task accepted."""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator, MaxValueValidator, MinValueValidator

# Steps in one plan (routing.plans reads it from here).
MAX_STEPS_PER_PLAN = 5
# Steps over the whole run: every plan has at most MAX_STEPS_PER_PLAN, and nested plans add theirs.
MAX_STEPS = MAX_STEPS_PER_PLAN * 20
MAX_DEPTH = 5
MAX_USD = Decimal("100000")
# max_usd is stored as DECIMAL(20, 10); MAX_USD keeps it well within the digits.
USD_MAX_DIGITS = 20
USD_DECIMAL_PLACES = 10
IDEMPOTENCY_KEY_MAX_CHARS = 200
DOMAIN_MAX_CHARS = 40

# Django's validators, with their own messages: a form runs them as they are and DRF runs them too, so
# the web form and the API refuse the same values with the same words.
MAX_STEPS_VALIDATORS = [MinValueValidator(1), MaxValueValidator(MAX_STEPS)]
MAX_DEPTH_VALIDATORS = [MinValueValidator(0), MaxValueValidator(MAX_DEPTH)]
MAX_USD_VALIDATORS = [MinValueValidator(Decimal("0")), MaxValueValidator(MAX_USD)]
IDEMPOTENCY_KEY_VALIDATORS = [MaxLengthValidator(IDEMPOTENCY_KEY_MAX_CHARS)]

# Names people pick and read (training jobs, the conductor versions they register, datasets): ASCII
# only, so that no two names look alike (a Cyrillic "ѕ" or a fullwidth "ｓ" passes str.isalnum()).
# A letter or digit first, then letters, digits, '-' and '_'; 1 to NAME_MAX_CHARS characters.
NAME_MAX_CHARS = 80
NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{NAME_MAX_CHARS - 1}}}$"
NAME_RULE = (
    f"A name is 1 to {NAME_MAX_CHARS} ASCII characters: letters A-Z a-z, digits 0-9, '-' and '_', "
    "starting with a letter or digit."
)
_NAME = re.compile(NAME_PATTERN.replace("$", r"\Z"), re.ASCII)


def name_check(name: str) -> None:
    """A training job's, a conductor version's or a dataset's name against NAME_PATTERN; the message
    names the first character that is not allowed (look-alikes by their Unicode name)."""
    if isinstance(name, str) and _NAME.match(name):
        return
    text = name if isinstance(name, str) else ""
    bad = next((c for c in text if not (c.isascii() and (c.isalnum() or c in "-_"))), None)
    if bad is not None:
        detail = f" {bad!r} (U+{ord(bad):04X} {unicodedata.name(bad, 'unnamed')}) is not allowed."
    elif not text:
        detail = " The name is empty."
    elif len(text) > NAME_MAX_CHARS:
        detail = f" The name has {len(text)} characters."
    else:
        detail = f" {text[0]!r} may not come first."
    raise ValidationError(NAME_RULE + detail, code="invalid_name")


def text_length_check(text: str) -> None:
    """The task text's length against CONDUCTOR_MAX_TASK_CHARS (a setting, so read at each call)."""
    limit = settings.CONDUCTOR_MAX_TASK_CHARS
    if len(text) > limit:
        raise ValidationError(f"At most {limit} characters. The task text has {len(text)}.")


# What a conductor writes around the task when a step quotes it (the static rules' cross-check, a learned
# workflow's): a step's instruction holds the longest task allowed, whole, plus this much.
INSTRUCTION_FRAMING_CHARS = 20_000


def instruction_max_chars() -> int:
    """The longest instruction a plan's step may hold: CONDUCTOR_MAX_TASK_CHARS, so that any task
    accepted can be quoted whole, plus INSTRUCTION_FRAMING_CHARS (read at each call, as the task's is)."""
    return settings.CONDUCTOR_MAX_TASK_CHARS + INSTRUCTION_FRAMING_CHARS


def budgets_check(*, max_steps: int | None, max_depth: int | None, max_usd: Decimal | None) -> None:
    """The budgets a submission asks for (None: the default), for callers without a form or serializer.
    Raises ValidationError keyed by the field."""
    for name, value, validators in (
        ("max_steps", max_steps, MAX_STEPS_VALIDATORS),
        ("max_depth", max_depth, MAX_DEPTH_VALIDATORS),
        ("max_usd", max_usd, MAX_USD_VALIDATORS),
    ):
        if value is None:
            continue
        for validator in validators:
            try:
                validator(value)
            except ValidationError as exc:
                raise ValidationError({name: exc.messages}) from exc
