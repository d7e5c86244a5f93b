"""`{% load display %}`: filters for showing untrusted text.

`controls_visible` shows the characters that change how text reads without being seen: the bidi
controls (a right-to-left override makes `exe.txt` of `txt.exe`) and the zero-width ones. The text is
escaped first; each such character is then replaced by a visible marker naming it. A zero-width joiner
that joins two emoji (👩🏽‍💻: woman, skin tone, ZWJ, laptop) is how that emoji is written and is left to
join them (static/js/live.js applies the same rule to live updates).
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

from audit import policies

register = template.Library()

# Bidi embeddings and overrides, isolates, marks; zero-width spaces and joiners, word joiner, BOM.
CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u200b-\u200d\u2060\ufeff]")
ZWJ = "\u200d"
# Pictographic characters, as Unicode's Extended_Pictographic property has them (its blocks, whole), and
# what may follow one inside an emoji before a joiner: a skin tone or the emoji presentation selector.
EMOJI = re.compile(
    "[\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u21ff\u231a-\u23ff\u24c2\u25aa-\u27bf\u2934\u2935"
    "\u2b05-\u2b55\u3030\u303d\u3297\u3299\U0001f000-\U0001faff]"
)
EMOJI_TAIL = re.compile("[\ufe0f\U0001f3fb-\U0001f3ff]")


def joins_emoji(text: str, at: int) -> bool:
    """Whether the zero-width joiner at text[at] joins two emoji (an emoji ZWJ sequence)."""
    before = at - 1
    if before >= 0 and EMOJI_TAIL.fullmatch(text[before]):
        before -= 1
    return (
        before >= 0
        and at + 1 < len(text)
        and bool(EMOJI.fullmatch(text[before]))
        and bool(EMOJI.fullmatch(text[at + 1]))
    )


def _marker(match: re.Match[str]) -> str:
    char = match.group()
    if char == ZWJ and joins_emoji(match.string, match.start()):
        return char
    code = f"U+{ord(char):04X}"
    name = unicodedata.name(char, "")
    # The code and the name are ours (ASCII), never the text's: nothing here needs escaping.
    return f'<span class="ctl" title="{code} {name}">\u27e8{code}\u27e9</span>'


@register.filter(is_safe=False)
def controls_visible(value: Any) -> SafeString:
    """The value escaped (unless already safe), with invisible bidi and zero-width characters shown."""
    escaped = str(conditional_escape(value))
    return mark_safe(CONTROLS.sub(_marker, escaped))  # noqa: S308 - escaped above; markers are ours


@register.inclusion_tag("_filter_select.html")
def filter_select(name: str, options: Any, current: Any, any_label: str) -> dict[str, Any]:
    """A list filter's <select>: `options` are values, or (value, label) pairs; `current` is chosen."""
    pairs = [o if isinstance(o, list | tuple) else (o, o) for o in options]
    return {
        "name": name,
        "options": pairs,
        "current": "" if current is None else str(current),
        "any_label": any_label,
    }


@register.filter
def item(mapping: Any, key: Any) -> Any:
    """mapping[key], or None: a dict read by a key the template holds (`notes=annotations|item:run.pk`)."""
    return mapping.get(key) if hasattr(mapping, "get") else None


@register.filter
def withheld_by_rule(checks: Any) -> list[dict[str, Any]]:
    """A plan's withheld workers by rule (audit.policies.withheld_by_rule)."""
    return policies.withheld_by_rule(checks)


@register.filter
def signed(value: Any, places: int = 3) -> str:
    """A difference with its sign always shown (+0.050, −0.012, 0.000); '—' when there is none."""
    if value is None or value == "":
        return "—"
    number = float(value)
    text = f"{abs(number):,.{int(places)}f}"
    if float(text.replace(",", "")) == 0:
        return text
    return ("+" if number > 0 else "\u2212") + text


@register.filter
def plain(value: Any) -> str:
    """A setting's value as a person reads it, not as Python prints it: none, yes/no, 0.5, a, b and
    key → value; … (used by pages and by the logs they show)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{k} \u2192 {plain(v)}" for k, v in value.items()) if value else "none"
    return str(value)


def settings_text(options: dict[str, Any]) -> str:
    """Settings as `name = value · …`, each value `plain`."""
    return " \u00b7 ".join(f"{name} = {plain(value)}" for name, value in options.items()) or "defaults"


@register.filter
def time_text(value: Any) -> str:
    """A moment written as ISO 8601 (what records and exports keep), as the pages write times:
    2026-11-26 20:45:30 UTC. Text that is no such moment is shown as it is."""
    if not value:
        return ""
    try:
        at = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if at.tzinfo else str(value)
