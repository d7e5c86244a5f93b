"""The auditor's public key: written beside the signing key when that key is made at first start,
offered for download on the verify page and by the audit API (with its fingerprint), and enough,
once fetched, to verify a dossier bundle with `python -m audit.bundle verify`."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import Client

from accounts.models import Role
from audit import note, signing
from audit.checkpoints import checkpoint_create
from audit.grants import token_create
from tests.audit.test_bundle import standalone, write

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_public_key_is_written_beside_the_signing_key_at_first_start(audit_files):
    key_file = audit_files.AUDIT_SIGNING_KEY_FILE
    assert not key_file.exists()

    signing.sign(b"first use")  # the key is made on first use

    public_file = key_file.with_name("signing-key.pub.pem")
    assert signing.public_key_file() == public_file
    assert public_file.read_text() == signing.public_pem()
    assert public_file.stat().st_mode & 0o777 == 0o644  # the secret stays 0600; this one anyone may read
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_a_signing_key_made_before_gets_its_public_key_written_too(audit_files):
    signing.sign(b"first use")
    public_file = signing.public_key_file()
    public_file.unlink()
    signing._load.cache_clear()  # the next process

    signing.sign(b"second process")

    assert public_file.read_text() == signing.public_pem()


def test_the_verify_page_offers_the_public_key_for_download(audit_files, make_user):
    client = Client()
    client.force_login(make_user("aida", Role.AUDITOR))

    page = client.get("/audit/verify/").content.decode()
    download = client.get("/audit/verify/public-key.pem")

    assert 'href="/audit/verify/public-key.pem"' in page and signing.key_id() in page
    assert download.status_code == 200
    assert download["Content-Type"] == "application/x-pem-file"
    assert download["Content-Disposition"] == 'attachment; filename="audit-public.pem"'
    assert download.content.decode() == signing.public_pem()
    operator = Client()
    operator.force_login(make_user("olga", Role.OPERATOR))
    assert operator.get("/audit/verify/public-key.pem").status_code == 403


def test_the_audit_api_gives_the_key_and_its_fingerprint_and_a_bundle_verifies_with_it(
    finished_run, audit_files, make_user, tmp_path
):
    user = make_user("aida", Role.AUDITOR)
    auditor = Client(HTTP_AUTHORIZATION=f"Token {token_create(user=user, role=Role.AUDITOR).key}")
    checkpoint_create()

    offered = auditor.get("/api/audit/public-key/").json()
    bundle = auditor.get(f"/api/audit/tasks/{finished_run.task_id}/dossier/").json()

    raw = serialization.load_pem_public_key(offered["pem"].encode()).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert offered["sha256"] == hashlib.sha256(raw).hexdigest()
    assert offered["key_id"] == signing.key_id()
    # The run's proof is its leaf in the log, under a tree head signed by the key offered.
    signed = bundle["runs"][0]["log"]["checkpoint"]
    origin = signed.split("\n")[0]
    assert note.opened(signed, origin, serialization.load_pem_public_key(offered["pem"].encode())).size >= 1
    key = tmp_path / "audit-public.pem"
    key.write_text(offered["pem"])
    result = standalone("verify", write(bundle, tmp_path), "--public-key", str(key))
    assert result.returncode == 0, result.stdout + result.stderr
    operator = make_user("olga", Role.OPERATOR)
    token = token_create(user=operator, role=Role.OPERATOR).key
    assert Client(HTTP_AUTHORIZATION=f"Token {token}").get("/api/audit/public-key/").status_code == 403


def test_the_key_offered_is_the_one_verification_trusts(audit_files, make_user, tmp_path):
    other = tmp_path / "trusted.pub.pem"
    other.write_text(signing.public_pem(Ed25519PrivateKey.generate().public_key()))
    audit_files.AUDIT_PUBLIC_KEY_FILE = str(other)
    client = Client()
    client.force_login(make_user("aida", Role.AUDITOR))

    assert client.get("/audit/verify/public-key.pem").content.decode() == other.read_text()
