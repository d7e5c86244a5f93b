from __future__ import annotations

import pytest

from routing.models import RunStatus
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json


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


@pytest.fixture
def finished_run(live_pool, audit_files):
    """A two-step run that succeeded: its chain is sealed into the global chain and the log, and the
    sealer signed the tree head (with the test's own key: audit_files, set up first)."""
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check", "all")))])
    server.program("alpha", [Reply("draft: 42")])
    server.program("beta", [Reply("42")])
    run = run_now(submit())
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run
