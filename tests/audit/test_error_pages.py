"""The pages people land on when something is not for them: 403 and 404 in the app's layout, the login
page's error, and the favicon every page load asks for."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.urls import Resolver404, resolve

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


def links(html: str) -> list[str]:
    return re.findall(r'<a\b[^>]*\bhref="([^"]*)"', html)


def test_a_user_without_a_role_is_told_why_and_how_to_get_one(client, make_user):
    client.force_login(make_user("nora"))

    response = client.get("/")

    assert response.status_code == 403
    html = response.content.decode()
    assert "this page needs one of the roles: auditor, operator, ml_staff, admin" in html.lower()
    assert "has no role yet" in html
    assert "grant_role nora auditor" in html
    # Logging out is offered (a POST form with its CSRF token) ...
    assert re.search(r'<form class="logout" method="post" action="/logout/">', html)
    assert 'name="csrfmiddlewaretoken"' in html and "Log out" in html
    # ... and no link to a page that would answer 403 again, not even the brand's.
    for href in links(html):
        if href.startswith("/") and not href.startswith("/static/"):
            assert client.get(href).status_code not in (403, 404), f"{href} is linked but closed to nora"
    assert "/ops/" not in html and "/audit/" not in html


def test_a_user_with_a_role_is_told_which_roles_the_page_needs_and_gets_a_link_home(client, make_user):
    client.force_login(make_user("otto", "operator"))

    response = client.get("/audit/")

    assert response.status_code == 403
    html = response.content.decode()
    assert "This page needs one of the roles: auditor" in html
    assert "with the role operator" in html and "manage.py grant_role otto" in html
    assert "/" in links(html)  # the task list, which an operator may open
    assert "/tasks/new/" in links(html)  # the usual navigation


def test_the_reason_is_escaped(rf, make_user):
    from django.core.exceptions import PermissionDenied
    from django.views.defaults import permission_denied

    request = rf.get("/")
    request.user = make_user("otto", "operator")

    response = permission_denied(request, PermissionDenied("<script>alert(1)</script>"))

    assert response.status_code == 403
    assert b"<script>alert(1)</script>" not in response.content
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in response.content


def test_page_not_found_is_a_page_of_the_app(client, make_user):
    client.force_login(make_user("otto", "operator"))

    response = client.get("/no/such/page/")

    assert response.status_code == 404
    html = response.content.decode()
    assert "Page not found" in html and "/no/such/page/" in html
    assert 'href="/static/css/app.css"' in html and "Log out" in html
    assert "/" in links(html)


def test_page_not_found_links_nothing_closed_to_a_user_without_a_role(client, make_user):
    client.force_login(make_user("nora"))

    response = client.get("/no/such/page/")

    assert response.status_code == 404
    html = response.content.decode()
    assert "has no role yet" in html and "Log out" in html
    assert [h for h in links(html) if not h.startswith("/static/")] == []


# --- favicon -----------------------------------------------------------------------------------------


def test_every_page_links_the_svg_favicon(client):
    html = client.get("/login/").content.decode()

    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    icon = finders.find("favicon.svg")
    assert icon is not None
    with open(icon, encoding="utf-8") as f:
        svg = f.read()
    assert svg.lstrip().startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in svg


def test_favicon_ico_answers_with_the_svg_icon(client):
    response = client.get("/favicon.ico")

    assert response.status_code == 302
    assert response["Location"] == "/static/favicon.svg"
    with pytest.raises(Resolver404):
        resolve("/static/favicon.svg")  # served by WhiteNoise from the collected files, not a view


# --- login ---------------------------------------------------------------------------------------------


def test_a_wrong_password_is_reported_once(client, make_user):
    make_user("ann", "auditor", password=PASSWORD)

    response = client.post("/login/", {"username": "ann", "password": "wrong"})

    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('class="error"') + html.count('class="errorlist') == 1, html
    assert html.count("Please enter a correct username and password") == 1
    assert 'name="username"' in html and 'name="password"' in html


def test_a_missing_field_is_reported_beside_it(client):
    response = client.post("/login/", {"username": "ann", "password": ""})

    html = response.content.decode()
    assert html.count("This field is required.") == 1
    assert "Please enter a correct username and password" not in html
