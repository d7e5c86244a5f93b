"""The checkpoint signing key: Ed25519, kept in a file outside the database.

In production, mount the key from a secret store and point AUDIT_SIGNING_KEY_FILE at it; only the
public key needs to be known to whoever verifies. Locally, a key is generated on first use, and its
public key written beside it (signing-key.pem: signing-key.pub.pem), the file to give auditors.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from functools import lru_cache
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings


class SigningKeyError(RuntimeError):
    pass


@lru_cache(maxsize=4)
def _load(path: str) -> Ed25519PrivateKey:
    key_path = Path(path)
    if not key_path.exists():
        if not settings.AUDIT_SIGNING_KEY_AUTOCREATE:
            raise SigningKeyError(f"no audit signing key at {key_path} (AUDIT_SIGNING_KEY_FILE)")
        key_path.parent.mkdir(parents=True, exist_ok=True)
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{key_path} is not an Ed25519 private key")
    if settings.AUDIT_SIGNING_KEY_AUTOCREATE:  # a key of ours (not one mounted from a secret store)
        _public_file_write(_public_path(key_path), public_pem(key.public_key()))
    return key


def _public_path(key_path: Path) -> Path:
    return key_path.with_name(f"{key_path.stem}.pub.pem")


def _public_file_write(path: Path, pem: str) -> None:
    """The public key beside the signing key, for auditors (readable by all), unless it is there: also
    for a key made before this file was written."""
    with contextlib.suppress(OSError):  # a folder we may not write: the page and the API still offer it
        if path.exists() and path.read_text() == pem:
            return
        tmp = path.with_name(f"{path.name}.tmp")
        tmp.write_text(pem)
        tmp.chmod(0o644)
        tmp.replace(path)


def public_key_file() -> Path:
    """The public key's file: AUDIT_PUBLIC_KEY_FILE, else the one written beside the signing key."""
    configured = settings.AUDIT_PUBLIC_KEY_FILE
    return Path(configured) if configured else _public_path(Path(settings.AUDIT_SIGNING_KEY_FILE))


def private_key() -> Ed25519PrivateKey:
    return _load(str(settings.AUDIT_SIGNING_KEY_FILE))


def public_key() -> Ed25519PublicKey:
    return private_key().public_key()


def trusted_public_key(path: Path | str | None = None) -> Ed25519PublicKey:
    """The key verification trusts: a PEM public key given (command line, AUDIT_PUBLIC_KEY_FILE), or
    the signing key's own. Never the key printed inside a checkpoint file: whoever can write files
    could sign with a key of their own."""
    path = path or settings.AUDIT_PUBLIC_KEY_FILE
    if not path:
        return public_key()
    key = serialization.load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path} is not an Ed25519 public key")
    return key


def public_pem(key: Ed25519PublicKey | None = None) -> str:
    return (
        (key or public_key())
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def fingerprint(key: Ed25519PublicKey | None = None) -> str:
    """The SHA-256 of the raw public key, in hex: to compare out of band."""
    raw = (key or public_key()).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def key_id(key: Ed25519PublicKey | None = None) -> str:
    """The fingerprint's first 16 digits, as each checkpoint names the key that signed it."""
    return fingerprint(key)[:16]


def public_key_offered() -> dict[str, str] | None:
    """The key verification trusts, as the verify page and the audit API offer it to auditors (None
    where there is none: no signing key, and none may be made; a file that is not a key)."""
    try:
        key = trusted_public_key()
    except (SigningKeyError, OSError, ValueError):
        return None
    return {"pem": public_pem(key), "key_id": key_id(key), "sha256": fingerprint(key)}


def sign(message: bytes) -> str:
    return private_key().sign(message).hex()


def verify(message: bytes, signature_hex: str, key: Ed25519PublicKey | None = None) -> bool:
    try:
        (key or public_key()).verify(bytes.fromhex(signature_hex), message)
    except (InvalidSignature, ValueError):
        return False
    return True
