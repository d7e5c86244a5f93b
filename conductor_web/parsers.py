"""The REST API's JSON parser: a body the database could not store, or that would exhaust the
interpreter's stack, is a 400 with the reason, not a 500."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32  # deeper than any body this API takes (configs nest 3-4 levels)


def _check(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ParseError(f"JSON body nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise ParseError("JSON body contains a NUL character (\\u0000), which cannot be stored")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(key, depth + 1)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = json.loads(stream.read().decode(encoding), parse_constant=_refuse_constant)
        except RecursionError as exc:
            raise ParseError(f"JSON body nested deeper than {MAX_DEPTH} levels") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        _check(data)
        return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
