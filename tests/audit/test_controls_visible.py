"""Invisible bidi and zero-width characters in untrusted text are shown, escaped, in lists and dossiers
(`{% load display %}{{ value|controls_visible }}`)."""

from __future__ import annotations

import pytest
from django.template import Context, Template
from django.test import Client
from django.utils.safestring import mark_safe

from accounts.models import Role
from routing.models import RunStatus
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json

RLO = "\u202e"
CONTROLS = [
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
    "\u200e",
    "\u200f",
    "\u061c",
    "\u200b",
    "\u200c",
    "\u200d",
    "\ufeff",
]


def render(value) -> str:
    return Template("{% load display %}{{ value|controls_visible }}").render(Context({"value": value}))


def test_each_control_is_replaced_by_a_marker_naming_it():
    for char in CONTROLS:
        html = render(f"a{char}b")
        code = f"U+{ord(char):04X}"
        assert char not in html
        assert f'<span class="ctl" title="{code} ' in html and f"\u27e8{code}\u27e9</span>" in html, code
    assert render(f"<i>{RLO}</i>") == (
        '&lt;i&gt;<span class="ctl" title="U+202E RIGHT-TO-LEFT OVERRIDE">\u27e8U+202E\u27e9</span>&lt;/i&gt;'
    )
    assert render("plain & simple") == "plain &amp; simple"
    assert render(mark_safe("<b>ok</b>")) == "<b>ok</b>"  # already safe: not escaped twice
    assert render(None) == "None" and render(42) == "42"


@pytest.mark.django_db(transaction=True)
def test_task_pages_and_the_dossier_show_controls_visibly_and_keep_markup_escaped(
    live_pool, audit_files, make_user
):
    text = f"Rename invoice{RLO}fdp.exe <b>now</b>"
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", f"Repeat{RLO} it", [])))])
    server.program("alpha", [Reply("done\u2066 <i>ok</i>")])
    run = run_now(submit(text))
    assert run.status == RunStatus.SUCCEEDED, run.error
    client = Client()
    client.force_login(make_user("ann", Role.AUDITOR, Role.OPERATOR))
    # A failed login puts an attacker's username into the audit log, shown as the actor's name.
    Client().post("/login/", {"username": f"admin{RLO}", "password": "wrong"})

    pages = {
        "task list": client.get("/"),
        "task page": client.get(f"/tasks/{run.task_id}/"),
        "dossier": client.get(f"/audit/tasks/{run.task_id}/"),
        "dossier file": client.get(f"/audit/tasks/{run.task_id}/", {"download": "1"}),
        "event log": client.get("/audit/"),
    }

    rlo_marker = '<span class="ctl" title="U+202E RIGHT-TO-LEFT OVERRIDE">\u27e8U+202E\u27e9</span>'
    for name, response in pages.items():
        assert response.status_code == 200, name
        html = response.content.decode()
        assert RLO not in html and "\u2066" not in html, name
        assert "<b>" not in html and "<i>ok" not in html, name
        assert rlo_marker in html, name
    for name in ("task list", "task page", "dossier", "dossier file"):
        html = pages[name].content.decode()
        assert f"Rename invoice{rlo_marker}fdp.exe &lt;b&gt;now&lt;/b&gt;" in html, name
    for name in ("task page", "dossier", "dossier file"):
        html = pages[name].content.decode()
        assert f"Repeat{rlo_marker} it" in html, name  # the instruction
        assert 'done<span class="ctl" title="U+2066 LEFT-TO-RIGHT ISOLATE">' in html, name  # the response
        assert "&lt;i&gt;ok&lt;/i&gt;" in html, name
    assert f"admin{rlo_marker}" in pages["event log"].content.decode()
    assert ".ctl {" in pages["dossier file"].content.decode()  # the marker's style goes with the file


def test_a_joiner_between_two_emoji_joins_them_and_any_other_joiner_is_shown():
    technologist = "\U0001f469\U0001f3fd\u200d\U0001f4bb"  # woman, medium skin tone, ZWJ, laptop
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    rainbow_flag = "\U0001f3f3\ufe0f\u200d\U0001f308"

    for emoji in (technologist, family, rainbow_flag):
        assert render(f"coder {emoji}!") == f"coder {emoji}!", emoji
    marker = '<span class="ctl" title="U+200D ZERO WIDTH JOINER">\u27e8U+200D\u27e9</span>'
    assert render("pay\u200dpal") == f"pay{marker}pal"
    assert render("\U0001f469\u200d") == f"\U0001f469{marker}"  # joins nothing
    assert render(f"\u200d{technologist}") == f"{marker}{technologist}"
    assert render(f"{technologist}{RLO}") == (
        f'{technologist}<span class="ctl" title="U+202E RIGHT-TO-LEFT OVERRIDE">\u27e8U+202E\u27e9</span>'
    )
