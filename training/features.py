"""The learned policy's features: hashed words and word pairs of the task's text, and its kind.

A kind the policy knows (one of `kinds`, learned from its training items: training.kinds) sets an
indicator (v1), or crosses the words and the dense buckets with the kind (v2); any other kind sets
nothing, so the text alone decides (the text-only path). Versioned with the policy file that uses them.
"""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np

from .kinds import LEGACY_KINDS

FEATURES = 4096  # hashed words and word pairs (v1 and v2)
CROSSED = 4096  # v2: the same tokens hashed again per kind (kind x word)
_WORD = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _hash(token: str, size: int) -> int:
    return int(hashlib.blake2b(token.encode(), digest_size=4).hexdigest(), 16) % size


def features_v1(text: str, kind: str, kinds: list[str]) -> np.ndarray:
    """Hashed words and word pairs, an indicator of the task's kind (none for a kind not in `kinds`:
    the text-only path), and length buckets."""
    x = np.zeros(FEATURES + len(kinds) + 4, dtype=np.float32)
    words = _WORD.findall(text.lower())
    for token in words + [f"{p} {q}" for p, q in zip(words, words[1:], strict=False)]:
        x[_hash(token, FEATURES)] = 1.0
    norm = math.sqrt(max(float(x[:FEATURES].sum()), 1.0))
    x[:FEATURES] /= norm
    if kind in kinds:
        x[FEATURES + kinds.index(kind)] = 1.0
    length = len(text)
    x[FEATURES + len(kinds) :] = [length < 200, 200 <= length < 500, 500 <= length < 1000, length >= 1000]
    return x


_LENGTHS = (200, 350, 500, 800, 1200)  # characters
_COUNTS = (2, 4, 7, 12)  # numbers in the text
_MAGNITUDES = (10, 100, 1000, 100000)  # the largest number
_LINES = (3, 8, 15, 25)  # lines (code)
_BUCKETS = len(_LENGTHS) + len(_COUNTS) + len(_MAGNITUDES) + len(_LINES) + 4


def _dense(kinds: list[str]) -> int:
    return 1 + (len(kinds) + 1) * (1 + _BUCKETS)  # bias; per kind (and "other"): indicator + buckets


def _bucket(value: float, edges: tuple[float, ...]) -> np.ndarray:
    out = np.zeros(len(edges) + 1, dtype=np.float32)
    out[sum(value >= e for e in edges)] = 1.0
    return out


def features_v2(text: str, kind: str, kinds: list[str]) -> np.ndarray:
    """v1's hashed words and word pairs, the same again crossed with the kind, and per-kind buckets
    of length, count and magnitude of numbers, and lines."""
    x = np.zeros(FEATURES + CROSSED + _dense(kinds), dtype=np.float32)
    lower = text.lower()
    words = _WORD.findall(lower)
    tokens = set(words + [f"{p} {q}" for p, q in zip(words, words[1:], strict=False)])
    crossed = kind if kind in kinds else ""
    for token in tokens:
        x[_hash(token, FEATURES)] = 1.0
        x[FEATURES + _hash(f"{crossed}|{token}", CROSSED)] = 1.0
    for start, size in ((0, FEATURES), (FEATURES, CROSSED)):
        block = x[start : start + size]
        block /= math.sqrt(max(float(block.sum()), 1.0))
    numbers = [float(n) for n in _NUMBER.findall(lower)[:200]]
    dense = np.concatenate(
        [
            [1.0],
            _bucket(len(text), _LENGTHS),
            _bucket(len(numbers), _COUNTS),
            _bucket(max(numbers, default=0.0), _MAGNITUDES),
            _bucket(text.count("\n") + 1, _LINES),
        ]
    )
    slot = kinds.index(kind) if kind in kinds else len(kinds)
    base = FEATURES + CROSSED
    x[base] = 1.0  # bias
    start = base + 1 + slot * (1 + _BUCKETS)
    x[start : start + 1 + _BUCKETS] = dense[: 1 + _BUCKETS]
    return x


FEATURE_SETS = {"v1": features_v1, "v2": features_v2}
DEFAULT_FEATURES = "v1"  # v2 did not beat v1 in 5-fold cross-validation on train


def feature_size(feature_set: str, kinds: list[str]) -> int:
    return FEATURES + len(kinds) + 4 if feature_set == "v1" else FEATURES + CROSSED + _dense(kinds)


FEATURE_SIZES = {name: feature_size(name, LEGACY_KINDS) for name in FEATURE_SETS}  # formats 1 and 2


def features(text: str, kind: str, kinds: list[str], feature_set: str = DEFAULT_FEATURES) -> np.ndarray:
    return FEATURE_SETS[feature_set](text, kind, kinds)
