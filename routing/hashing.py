"""The hash of a JSON value that events record for what they do not carry (messages, responses)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def content_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
