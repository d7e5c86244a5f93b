"""The dossier bundle carries its own proof, and a standalone verifier checks it with the public key
alone: in a subprocess where Django cannot be imported and no database is reachable."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.test import Client

from accounts.models import Role
from audit import signing
from audit.checkpoints import checkpoint_create
from audit.proof import digest

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(settings.BASE_DIR)
# The verifier as an external auditor runs it: Django made unimportable, no database anywhere.
NO_DJANGO = (
    "import sys; sys.modules['django'] = None; from audit.bundle import main; sys.exit(main(sys.argv[1:]))"
)


def standalone(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "DATABASE", "REDIS"))}
    env["DATABASE_URL"] = "postgres://nobody@127.0.0.1:9/none"  # nothing listens there
    return subprocess.run(
        [sys.executable, "-c", NO_DJANGO, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def exported(finished_run, audit_files, make_user, tmp_path):
    """A finished run's dossier bundle, downloaded by an auditor after a checkpoint, and the public key."""
    checkpoint_create()
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    response = client.get(f"/audit/tasks/{finished_run.task_id}/?download=bundle")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="dossier-{finished_run.task_id}.json"'
    key = tmp_path / "audit-public.pem"
    key.write_text(signing.public_pem())
    return json.loads(response.content), key, tmp_path


def write(bundle: dict, folder: Path, name: str = "dossier.json") -> str:
    path = folder / name
    path.write_text(json.dumps(bundle))
    return str(path)


def test_an_untouched_bundle_verifies_with_the_public_key_alone(exported):
    bundle, key, folder = exported
    assert [len(r["events"]) for r in bundle["runs"]] and bundle["runs"][0]["checkpoint"] is not None
    result = standalone("verify", write(bundle, folder), "--public-key", str(key))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("intact: task ") and "signed by checkpoint(s) 1" in result.stdout
    # The documented command works too.
    documented = subprocess.run(
        [sys.executable, "-m", "audit.bundle", "verify", write(bundle, folder), "--public-key", str(key)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert documented.returncode == 0, documented.stdout + documented.stderr


def _step(bundle: dict, index: int = 0) -> dict:
    return bundle["runs"][0]["steps"][index]


def _event(bundle: dict, action: str) -> dict:
    return next(e for e in bundle["runs"][0]["events"] if e["content"]["action"] == action)


def _rehash_from(bundle: dict, event: dict) -> None:
    """What a forger does next: recompute every hash from the altered event on."""
    events = bundle["runs"][0]["events"]
    start = events.index(event)
    for i in range(start, len(events)):
        if i:
            events[i]["prev_hash"] = events[i - 1]["hash"]
        events[i]["hash"] = digest(events[i]["prev_hash"], events[i]["content"])


def shown_vendor(bundle):
    _step(bundle)["vendor"] = "elsewhere"


def shown_response(bundle):
    _step(bundle)["response"] = "forged"


def shown_instruction(bundle):
    _step(bundle)["instruction"] = "forged"


def shown_plan(bundle):
    bundle["runs"][0]["decisions"][0]["plan"]["steps"][0]["worker"] = "gamma"


def shown_classification(bundle):
    bundle["task"]["classification"] = "public"


def shown_cost(bundle):
    bundle["runs"][0]["attempts"][0]["cost_usd"] = "0"


def shown_answer(bundle):
    bundle["runs"][0]["final_answer"] = "forged"


def event_rewritten(bundle):
    _event(bundle, "step.started")["content"]["payload"]["vendor"] = "elsewhere"


def event_rewritten_and_rehashed(bundle):
    event = _event(bundle, "step.started")
    event["content"]["payload"]["vendor"] = "elsewhere"
    _step(bundle)["vendor"] = "elsewhere"
    _rehash_from(bundle, event)


def last_events_dropped(bundle):
    del bundle["runs"][0]["events"][-2:]


def checkpoint_body_edited(bundle):
    bundle["runs"][0]["checkpoint"]["body"]["created_at"] = "2000-01-01T00:00:00+00:00"


def checkpoint_resigned_with_another_key(bundle):
    checkpoint = bundle["runs"][0]["checkpoint"]
    other = Ed25519PrivateKey.generate()
    checkpoint["signature"] = other.sign(
        json.dumps(checkpoint["body"], sort_keys=True, separators=(",", ":")).encode()
    ).hex()


TAMPERED = {
    shown_vendor: "step {step}'s vendor is 'elsewhere' in the dossier",
    shown_response: "step {step}'s response (sha256)",
    shown_instruction: "step {step}'s instruction (sha256)",
    shown_plan: "'s plan (sha256)",
    shown_classification: "the task's classification is 'public' in the dossier",
    shown_cost: "cost_usd is '0' in the dossier",
    shown_answer: "final answer (sha256)",
    event_rewritten: "its content was altered",
    event_rewritten_and_rehashed: "with hash",
    last_events_dropped: "the bundle has no such event",
    checkpoint_body_edited: "its signature does not hold",
    checkpoint_resigned_with_another_key: "its signature does not hold",
}


@pytest.mark.parametrize("tamper", list(TAMPERED), ids=[t.__name__ for t in TAMPERED])
def test_each_alteration_of_a_bundle_is_named(exported, tamper):
    bundle, key, folder = exported
    forged = copy.deepcopy(bundle)
    tamper(forged)
    result = standalone("verify", write(forged, folder, "forged.json"), "--public-key", str(key))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("NOT INTACT")
    expected = TAMPERED[tamper].format(step=_step(bundle)["id"])
    assert expected in result.stdout, result.stdout


def test_a_bundle_checked_with_another_key_does_not_verify(exported):
    bundle, _, folder = exported
    other = folder / "other.pem"
    other.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    result = standalone("verify", write(bundle, folder), "--public-key", str(other))
    assert result.returncode == 1 and "its signature does not hold with the trusted key" in result.stdout


def test_a_purged_tasks_bundle_carries_the_signed_purge_for_its_deleted_chain(
    finished_run, audit_files, make_user, tmp_path
):
    from django.utils import timezone

    from audit.services import Actor
    from routing.retention import task_purge

    checkpoint_create()
    task_purge(task=finished_run.task, actor=Actor.service("retention"), now=timezone.now())
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    bundle = json.loads(client.get(f"/audit/tasks/{finished_run.task_id}/?download=bundle").content)
    run = bundle["runs"][0]
    assert run["events"] == [] and run["purge"]["signature"]
    key = tmp_path / "audit-public.pem"
    key.write_text(signing.public_pem())
    assert standalone("verify", write(bundle, tmp_path), "--public-key", str(key)).returncode == 0
    run["purge"]["body"]["last_seq"] = 1  # a purge that claims to have emptied less
    result = standalone("verify", write(bundle, tmp_path, "forged.json"), "--public-key", str(key))
    assert result.returncode == 1 and "purge whose signature does not hold" in result.stdout, result.stdout
