from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Many users are made here; the default PBKDF2 cost would dominate the run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
