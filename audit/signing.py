"""The checkpoint signing key: Ed25519, kept in a file outside the database.

In production, mount the key from a secret store and point AUDIT_SIGNING_KEY_FILE at it; only the
public key needs to be known to whoever verifies. Locally, a key is generated on first use.
"""

from __future__ import annotations

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
    return key


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


def key_id(key: Ed25519PublicKey | None = None) -> str:
    raw = (key or public_key()).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(message: bytes) -> str:
    return private_key().sign(message).hex()


def verify(message: bytes, signature_hex: str, key: Ed25519PublicKey | None = None) -> bool:
    try:
        (key or public_key()).verify(bytes.fromhex(signature_hex), message)
    except (InvalidSignature, ValueError):
        return False
    return True
