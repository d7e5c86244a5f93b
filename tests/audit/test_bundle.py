"""The dossier bundle carries its own proof, and a standalone verifier checks it with the public key
alone: in a subprocess where Django cannot be imported and no database is reachable. A run's proof is
its place in the audit log (its seal a leaf of the Merkle tree, the audit path to the root of a signed
tree head); a run sealed before the log is covered by the old per-chain checkpoint instead."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import transaction
from django.test import Client

from accounts.models import Role
from audit import chain as audit_chain
from audit import merkle, note, signing
from audit.actions import Action
from audit.checkpoints import checkpoint_create
from audit.proof import canonical, digest
from audit.seals import pending_seal, seal_pending

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


def other_leaves(count: int) -> None:
    """Other runs' seals in the log: chains of one sealing event each, their pending seals sealed."""
    for number in range(count):
        correlation = uuid.uuid4()
        with transaction.atomic():
            last = audit_chain.append(
                chain=audit_chain.run_chain(correlation),
                seal=True,
                actor_type="service",
                actor_id="",
                actor_name="engine",
                action=Action.RUN_SUCCEEDED,
                object_type="run",
                object_id=str(10_000 + number),
                task_id=None,
                correlation_id=correlation,
                payload={},
            )
            run = SimpleNamespace(_meta=SimpleNamespace(model_name="run"), pk=10_000 + number)
            pending_seal(run=run, task_id=None, last=last).save()
    seal_pending()


@pytest.fixture
def leaves_before(audit_files):
    """Two seals in the log before the finished run's (which is then leaf 2)."""
    other_leaves(2)


@pytest.fixture
def exported(audit_files, leaves_before, finished_run, make_user, tmp_path):
    """A finished run's dossier bundle, downloaded by an auditor after three more runs were sealed and
    a checkpoint made (its leaf 2 of a tree of 6, a real audit path), and the public key."""
    other_leaves(3)
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
    run = bundle["runs"][0]
    assert run["events"] and run["checkpoint"] is None  # in the log: no per-chain checkpoint
    log = run["log"]
    assert (log["leaf_index"], log["tree_size"], len(log["audit_path"])) == (2, 6, 3)
    result = standalone("verify", write(bundle, folder), "--public-key", str(key))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("intact: task ")
    assert f"signed by checkpoint(s) {log['checkpoint_number']}\n" in result.stdout
    # What it did not prove, field by field.
    assert "not proven (no event binds them):\n- exported_at, exported_by" in result.stdout
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


def _log(bundle: dict) -> dict:
    return bundle["runs"][0]["log"]


def log_path_hash_edited(bundle):
    path = _log(bundle)["audit_path"]
    path[1] = ("0" if path[1][0] != "0" else "1") + path[1][1:]


def log_leaf_index_edited(bundle):
    _log(bundle)["leaf_index"] += 1


def log_tree_size_edited(bundle):
    _log(bundle)["tree_size"] += 1


def log_note_text_edited(bundle):
    log = _log(bundle)
    text, _, signatures = log["checkpoint"].partition("\n\n")
    lines = text.split("\n")
    lines[-1] = "time 2000-01-01T00:00:00+00:00"
    log["checkpoint"] = "\n".join(lines) + "\n\n" + signatures


def log_note_signed_by_another_key(bundle):
    log = _log(bundle)
    text, _ = note.split(log["checkpoint"])
    log["checkpoint"] = note.sign(text, note.tree_head(text).origin, Ed25519PrivateKey.generate())


def log_leaf_not_the_chains_end(bundle):
    log = _log(bundle)
    leaf = json.loads(log["leaf"])
    leaf["seq"] -= 1
    log["leaf"] = canonical(leaf).decode()
    log["leaf_hash"] = merkle.leaf_hash(log["leaf"].encode()).hex()


TAMPERED = {
    shown_vendor: "step {step}'s vendor is 'elsewhere' in the dossier",
    shown_response: "step {step}'s response (sha256)",
    shown_instruction: "step {step}'s instruction (sha256)",
    shown_plan: "'s plan (sha256)",
    shown_classification: "the task's classification is 'public' in the dossier",
    shown_cost: "cost_usd is '0' in the dossier",
    shown_answer: "final answer (sha256)",
    event_rewritten: "its content was altered",
    event_rewritten_and_rehashed: "is not the chain's end",
    last_events_dropped: "is not the chain's end",
    log_path_hash_edited: "an audit path hash or the leaf index was changed",
    log_leaf_index_edited: "an audit path hash or the leaf index was changed",
    log_tree_size_edited: "its log section says tree size 7; the signed tree head of 6 leaves",
    log_note_text_edited: "does not hold with the trusted key: the checkpoint's signature by",
    log_note_signed_by_another_key: "does not hold with the trusted key: the checkpoint bears no signature",
    log_leaf_not_the_chains_end: "the leaf its log section shows is not the chain's end",
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
    assert result.returncode == 1 and "does not hold with the trusted key" in result.stdout, result.stdout


def test_a_run_in_neither_the_log_nor_a_checkpoint_is_named(exported):
    bundle, key, folder = exported
    bundle["runs"][0]["log"] = None
    result = standalone("verify", write(bundle, folder), "--public-key", str(key))
    assert result.returncode == 1
    assert "no signed checkpoint covers this chain yet (no signed tree head" in result.stdout, result.stdout


def old_form(bundle: dict) -> dict:
    """The bundle as it was for a run sealed before the log: no log section, the checkpoint that
    signed its chain's head (FORMAT_HEADS: JSON, signed by the same key)."""
    run = bundle["runs"][0]
    last = run["events"][-1]
    body = {
        "format": "conductor-web/audit-checkpoint/2",
        "number": 1,
        "previous": "0" * 64,
        "created_at": "2026-01-01T00:00:00+00:00",
        "key_id": signing.key_id(),
        "heads": {"global": [1, "0" * 64], run["chain"]: [last["content"]["seq"], last["hash"]]},
    }
    run["log"], run["checkpoint"] = None, {"body": body, "signature": signing.sign(canonical(body))}
    return bundle


def checkpoint_body_edited(bundle):
    bundle["runs"][0]["checkpoint"]["body"]["created_at"] = "2000-01-01T00:00:00+00:00"


def checkpoint_resigned_with_another_key(bundle):
    checkpoint = bundle["runs"][0]["checkpoint"]
    other = Ed25519PrivateKey.generate()
    checkpoint["signature"] = other.sign(
        json.dumps(checkpoint["body"], sort_keys=True, separators=(",", ":")).encode()
    ).hex()


OLD_TAMPERED = {
    checkpoint_body_edited: "its signature does not hold",
    checkpoint_resigned_with_another_key: "its signature does not hold",
    event_rewritten_and_rehashed: "with hash",
    last_events_dropped: "the bundle has no such event",
}


def test_a_run_sealed_before_the_log_still_verifies_by_its_checkpoint(exported):
    bundle, key, folder = exported
    result = standalone("verify", write(old_form(bundle), folder), "--public-key", str(key))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "signed by checkpoint(s) 1\n" in result.stdout


@pytest.mark.parametrize("tamper", list(OLD_TAMPERED), ids=[t.__name__ for t in OLD_TAMPERED])
def test_each_alteration_of_a_bundle_of_before_the_log_is_named(exported, tamper):
    bundle, key, folder = exported
    forged = old_form(copy.deepcopy(bundle))
    tamper(forged)
    result = standalone("verify", write(forged, folder, "forged.json"), "--public-key", str(key))
    assert result.returncode == 1 and OLD_TAMPERED[tamper] in result.stdout, result.stdout


def test_a_purged_tasks_bundle_carries_the_signed_purge_for_its_deleted_chain(
    audit_files, finished_run, make_user, tmp_path
):
    from django.utils import timezone

    from audit.services import Actor
    from governance.retention import task_purge

    checkpoint_create()
    task_purge(task=finished_run.task, actor=Actor.service("retention"), now=timezone.now())
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR))
    bundle = json.loads(client.get(f"/audit/tasks/{finished_run.task_id}/?download=bundle").content)
    run = bundle["runs"][0]
    assert run["events"] == [] and run["purge"]["signature"] and run["log"] is not None
    key = tmp_path / "audit-public.pem"
    key.write_text(signing.public_pem())
    intact = standalone("verify", write(bundle, tmp_path), "--public-key", str(key))
    assert intact.returncode == 0, intact.stdout
    assert "deleted under the retention policy (the purge is proven)" in intact.stdout
    # Its leaf in the log is rebuilt from the head its signed purge emptied.
    run["log"]["leaf_index"] += 1
    moved = standalone("verify", write(bundle, tmp_path, "moved.json"), "--public-key", str(key))
    assert "an audit path hash or the leaf index was changed" in moved.stdout, moved.stdout
    run["log"]["leaf_index"] -= 1
    run["purge"]["body"]["last_seq"] = 1  # a purge that claims to have emptied less
    result = standalone("verify", write(bundle, tmp_path, "forged.json"), "--public-key", str(key))
    assert result.returncode == 1 and "purge whose signature does not hold" in result.stdout, result.stdout
