"""A password rule Django's validators miss: a password made mostly of the username ("annann",
"operator2024!!"). UserAttributeSimilarityValidator compares whole strings, so a short username
repeated or padded passes it."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError

MIN_USERNAME_CHARS = 3  # a shorter username is too common a substring to refuse


class UsernameInPasswordValidator:
    """Refuse a password of which the username (any case) makes up half or more."""

    def validate(self, password: str, user: Any = None) -> None:
        username = (user.get_username() if user is not None else "") or ""
        if len(username) < MIN_USERNAME_CHARS:
            return
        rest = re.sub(re.escape(username), "", password, flags=re.IGNORECASE)
        if len(rest) * 2 <= len(password):
            raise ValidationError("This password is mostly the username.", code="password_is_username")

    def get_help_text(self) -> str:
        return "Your password can't be mostly your username."
