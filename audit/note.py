"""Signed tree heads in the form transparency logs share: C2SP `tlog-checkpoint` text in a C2SP
`signed-note`, with C2SP `tlog-cosignature` lines from witnesses. What Go's sumdb and Sigstore parse,
and what the public witness network cosigns. No Django: the standalone bundle verifier reads it.

    <origin>
    <tree size>
    <root hash, base64>
    <extension lines: this log's own, each non-empty>

    — <key name> <base64(key hash[4] || Ed25519 signature[64])>
    — <witness name> <base64(key hash[4] || timestamp[8] || Ed25519 signature[64])>

A note signature (type 0x01) signs the text above the blank line; its key hash is the first four bytes
of SHA-256(name || "\\n" || 0x01 || public key). A cosignature (type 0x04) signs
"cosignature/v1\\ntime <seconds>\\n" followed by that text: a witness saying it saw this checkpoint, at
that time, and checked that it extends every one it saw before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519, COSIGNATURE = 0x01, 0x04
DASH = "\u2014 "  # an em dash and a space open every signature line


class NoteError(ValueError):
    """Text that is not a signed checkpoint: says what is wrong with it."""


@dataclass(frozen=True)
class TreeHead:
    """A checkpoint's text, parsed: the log, the tree's size and root, and this log's extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        for line in (self.origin, *self.extensions):
            if not line or "\n" in line:
                raise NoteError(f"a checkpoint line must be non-empty and one line: {line!r}")
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode(), *self.extensions]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Signature:
    name: str
    key_hash: bytes
    blob: bytes  # what follows the key hash: the signature (and a cosignature's timestamp)


def tree_head(text: str) -> TreeHead:
    """The checkpoint text (the part a signature covers) parsed, or NoteError saying why not."""
    if not text.endswith("\n"):
        raise NoteError("a checkpoint's text must end with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise NoteError("a checkpoint has an origin, a tree size and a root hash, one per line")
    origin, size, root, *extensions = lines
    if not origin:
        raise NoteError("a checkpoint's first line (the log's origin) is empty")
    if not size.isdigit() or (len(size) > 1 and size[0] == "0"):
        raise NoteError(f"a checkpoint's second line is its tree size in decimal, not {size[:40]!r}")
    try:
        root_hash = base64.b64decode(root, validate=True)
    except binascii.Error:
        raise NoteError("a checkpoint's third line (the root hash) is not base64") from None
    if len(root_hash) != 32:
        raise NoteError(f"a checkpoint's root hash is {len(root_hash)} bytes, not 32 (SHA-256)")
    if any(not line for line in extensions):
        raise NoteError("a checkpoint's extension lines must not be empty")
    return TreeHead(origin=origin, size=int(size), root=root_hash, extensions=tuple(extensions))


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_hash(name: str, key: Ed25519PublicKey, kind: int = ED25519) -> bytes:
    """The four bytes that name a key in a signature line."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + _raw(key)).digest()[:4]


def verifier_key(name: str, key: Ed25519PublicKey, kind: int = ED25519) -> str:
    """The key as note verifiers take it (`name+hash+base64(type || key)`), e.g. for Go's note package."""
    return f"{name}+{key_hash(name, key, kind).hex()}+{base64.b64encode(bytes([kind]) + _raw(key)).decode()}"


def _check_name(name: str) -> None:
    if not name or any(c.isspace() for c in name) or "+" in name:
        raise NoteError(f"a key name is non-empty, with no spaces and no '+': {name!r}")


def signature_line(name: str, key_id: bytes, blob: bytes) -> str:
    return f"{DASH}{name} {base64.b64encode(key_id + blob).decode()}\n"


def sign(text: str, name: str, key: Ed25519PrivateKey) -> str:
    """The note: the text, a blank line, and this key's signature line."""
    _check_name(name)
    tree_head(text)  # only checkpoint text is signed
    signature = key.sign(text.encode())
    return text + "\n" + signature_line(name, key_hash(name, key.public_key()), signature)


def _cosigned_message(text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


def cosignature(text: str, name: str, key: Ed25519PrivateKey, timestamp: int) -> str:
    """A witness's cosignature line over a checkpoint's text, made at `timestamp` (Unix seconds)."""
    _check_name(name)
    signed = key.sign(_cosigned_message(text, timestamp))
    return signature_line(
        name, key_hash(name, key.public_key(), COSIGNATURE), struct.pack(">Q", timestamp) + signed
    )


def split(note: str) -> tuple[str, list[Signature]]:
    """A note's text and its signature lines, or NoteError saying what is wrong."""
    text, sep, lines = note.rpartition("\n\n")
    if not sep:
        raise NoteError("a signed note is its text, a blank line, then signature lines; no blank line found")
    text += "\n"
    if not lines.endswith("\n"):
        raise NoteError("a signed note ends with a newline")
    signatures = []
    for line in lines[:-1].split("\n"):
        if not line.startswith(DASH):
            raise NoteError(f"a signature line starts with an em dash and a space: {line[:60]!r}")
        name, _, blob = line[len(DASH) :].rpartition(" ")
        try:
            raw = base64.b64decode(blob, validate=True)
        except binascii.Error:
            raise NoteError(f"the signature of {name!r} is not base64") from None
        if not name or len(raw) < 5:
            raise NoteError(f"a signature line names a key and carries its signature: {line[:60]!r}")
        signatures.append(Signature(name=name, key_hash=raw[:4], blob=raw[4:]))
    return text, signatures


def _holds(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def opened(note: str, name: str, key: Ed25519PublicKey) -> TreeHead:
    """The checkpoint of a note signed by key `name`: NoteError if the note is malformed, bears no
    signature of that key, or its signature does not hold."""
    text, signatures = split(note)
    head = tree_head(text)
    wanted = key_hash(name, key)
    mine = [s for s in signatures if s.name == name and s.key_hash == wanted]
    if not mine:
        named = ", ".join(sorted({s.name for s in signatures})) or "none"
        raise NoteError(f"the checkpoint bears no signature of the key {name} (it bears: {named})")
    if not any(len(s.blob) == 64 and _holds(key, s.blob, text.encode()) for s in mine):
        raise NoteError(
            f"the checkpoint's signature by {name} does not hold: its text was changed, or another key signed it"
        )
    return head


def cosigned_at(note: str, name: str, key: Ed25519PublicKey) -> int:
    """When witness `name` cosigned the note (Unix seconds): NoteError if it did not, or its
    cosignature does not hold."""
    text, signatures = split(note)
    wanted = key_hash(name, key, COSIGNATURE)
    for s in signatures:
        if s.name == name and s.key_hash == wanted and len(s.blob) == 72:
            (timestamp,) = struct.unpack(">Q", s.blob[:8])
            if _holds(key, s.blob[8:], _cosigned_message(text, timestamp)):
                return timestamp
            raise NoteError(f"the cosignature of witness {name} does not hold")
    raise NoteError(f"the checkpoint bears no cosignature of witness {name}")
