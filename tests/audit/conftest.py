from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Many users are made here; the default PBKDF2 cost would dominate the run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def audit_files(settings, tmp_path):
    """Checkpoint files and the signing key in a private directory (the key is made on first use)."""
    from audit import signing

    settings.AUDIT_CHECKPOINT_DIR = tmp_path / "checkpoints"
    settings.AUDIT_SIGNING_KEY_FILE = tmp_path / "keys" / "signing-key.pem"
    settings.AUDIT_SIGNING_KEY_AUTOCREATE = True
    signing._load.cache_clear()
    yield settings
    signing._load.cache_clear()
