"""A policy rule's vendors, regions and data classes: normalised, and only values that exist.

A `vendor_blocked` rule for "Google" must block the worker whose vendor is "google"; one for a vendor
no worker has would block nothing, so it is refused with the known vendors named. The admin's form
and the service both go through PolicyRule.clean() (audit.policies.rule_values_check); the known
vendors and regions come from routing's workers, registered into audit when routing starts.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from audit import policies
from audit.models import AuditEvent, PolicyRule
from audit.services import Actor
from routing.models import Worker

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/audit/policyrule/add/"


def worker(slug: str, vendor: str, region: str = "", self_hosted: bool = False) -> Worker:
    return Worker.objects.create(
        slug=slug,
        display_name=slug,
        litellm_model=f"openai/{slug}",
        vendor=vendor,
        region=region,
        self_hosted=self_hosted,
        input_usd_per_mtok=Decimal("1"),
        output_usd_per_mtok=Decimal("2"),
        price_source=Worker.PriceSource.OVERRIDE,
    )


@pytest.fixture
def pool() -> dict[str, Worker]:
    return {
        "gemini": worker("gemini", "google", "us-central1"),
        "mini": worker("mini", "openai", "eu-west-1"),
        "local": worker("local", "self-hosted", "eu-west-1", self_hosted=True),
    }


@pytest.fixture
def admin(client):
    user = get_user_model().objects.create_superuser("root", email="", password="y" * 12)
    client.force_login(user)
    return client


def rule_form(**values: str) -> dict[str, str]:
    data = {
        "name": "rule",
        "kind": PolicyRule.Kind.VENDOR_BLOCKED,
        "vendors": "",
        "regions": "",
        "data_classes": "",
        "description": "",
        "enabled": "on",
        "_save": "Save",
    }
    data.update(values)
    return data


def form_errors(response) -> dict[str, list[str]]:
    assert response.status_code == 200, f"expected the form again, got {response.status_code}"
    return {field: list(errors) for field, errors in response.context["adminform"].form.errors.items()}


# --- the admin form ------------------------------------------------------------------------------


def test_a_vendor_typed_in_another_case_is_stored_normalised_and_blocks_that_vendor(admin, pool):
    response = admin.post(ADD_URL, rule_form(name="no-google", vendors=" Google "))

    assert response.status_code == 302, form_errors(response)
    rule = PolicyRule.objects.get(name="no-google")
    assert rule.vendors == ["google"]
    verdict = policies.judge(pool["gemini"], "internal", [rule])
    assert not verdict.allowed and verdict.rule == "no-google"
    assert policies.judge(pool["mini"], "internal", [rule]).allowed
    event = AuditEvent.objects.get(action="policyrule.registered", object_id=str(rule.pk))
    assert event.payload["vendors"] == ["google"]  # what is stored, not what was typed
    assert event.payload["name"] == "no-google" and event.payload["via"] == "admin"


def test_an_unknown_vendor_is_refused_naming_the_known_ones(admin, pool):
    response = admin.post(ADD_URL, rule_form(name="no-gogle", vendors="gogle"))

    assert form_errors(response) == {
        "vendors": [
            "unknown vendor: gogle; known (the vendors of the registered workers): google, openai, self-hosted"
        ]
    }
    assert not PolicyRule.objects.exists()


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        (
            {"kind": PolicyRule.Kind.REGION_ALLOWED, "regions": "EU-West-1, mars-1, moon-2"},
            "regions",
            "unknown regions: mars-1, moon-2; known (the regions of the registered workers): "
            "eu-west-1, us-central1",
        ),
        (
            {"kind": PolicyRule.Kind.SELF_HOSTED_ONLY, "data_classes": "Confidential, secret"},
            "data_classes",
            "unknown data class: secret; known (the data classes): public, internal, confidential, restricted",
        ),
        (
            {"kind": PolicyRule.Kind.VENDOR_BLOCKED},
            "vendors",
            "a vendor_blocked rule needs at least one vendor; known (the vendors of the registered "
            "workers): google, openai, self-hosted",
        ),
        (
            {"kind": PolicyRule.Kind.REGION_ALLOWED, "data_classes": "restricted"},
            "regions",
            "a region_allowed rule needs at least one region; known (the regions of the registered "
            "workers): eu-west-1, us-central1",
        ),
        (
            {"kind": PolicyRule.Kind.SELF_HOSTED_ONLY, "vendors": "google"},
            "vendors",
            "a self_hosted_only rule does not use vendors: leave this empty",
        ),
    ],
    ids=["unknown-region", "unknown-data-class", "block-no-vendor", "allow-no-region", "unused-vendors"],
)
def test_a_rule_that_would_match_nothing_is_refused(admin, pool, values, field, message):
    response = admin.post(ADD_URL, rule_form(**values))

    assert form_errors(response) == {field: [message]}
    assert not PolicyRule.objects.exists()


def test_known_regions_and_data_classes_are_stored_normalised(admin, pool):
    response = admin.post(
        ADD_URL,
        rule_form(
            name="internal-in-eu",
            kind=PolicyRule.Kind.REGION_ALLOWED,
            regions=" EU-West-1 ,eu-west-1",
            data_classes="INTERNAL",
        ),
    )

    assert response.status_code == 302, form_errors(response)
    rule = PolicyRule.objects.get(name="internal-in-eu")
    assert (rule.regions, rule.data_classes) == (["eu-west-1"], ["internal"])
    assert policies.judge(pool["mini"], "internal", [rule]).allowed
    assert not policies.judge(pool["gemini"], "internal", [rule]).allowed


def test_the_form_lists_the_known_values(admin, pool):
    page = admin.get(ADD_URL)

    assert page.status_code == 200
    html = page.content.decode()
    assert "known: google, openai, self-hosted" in html
    assert "known: eu-west-1, us-central1" in html
    assert "known: public, internal, confidential, restricted" in html


# --- the service and the model -------------------------------------------------------------------


def test_the_service_runs_the_same_check_and_records_the_rule(pool):
    actor = Actor.service("test")
    with pytest.raises(ValidationError) as refused:
        policies.policy_rule_save(
            rule=PolicyRule(name="no-gogle", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["gogle"]),
            actor=actor,
            via="test",
        )
    assert refused.value.message_dict == {
        "vendors": [
            "unknown vendor: gogle; known (the vendors of the registered workers): google, openai, self-hosted"
        ]
    }
    assert not PolicyRule.objects.exists()

    rule = policies.policy_rule_save(
        rule=PolicyRule(name="no-google", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["GOOGLE"]),
        actor=actor,
        via="test",
    )

    assert PolicyRule.objects.get(pk=rule.pk).vendors == ["google"]
    event = AuditEvent.objects.get(action="policyrule.registered", object_id=str(rule.pk))
    assert event.payload["vendors"] == ["google"] and event.actor_name == "test"


def test_the_known_vendors_follow_the_workers_routing_registered(pool):
    assert policies.known_values()["vendors"] == ["google", "openai", "self-hosted"]

    worker("claude", " Anthropic ", "us-east-1")

    known = policies.known_values()
    assert known["vendors"] == ["anthropic", "google", "openai", "self-hosted"]
    assert known["regions"] == ["eu-west-1", "us-central1", "us-east-1"]
    PolicyRule(name="no-anthropic", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["anthropic"]).full_clean()


def test_a_rule_saved_without_the_form_is_still_stored_as_it_is_compared(pool):
    rule = PolicyRule.objects.create(
        name="no-google", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=[" Google"], data_classes=["Internal"]
    )

    rule.refresh_from_db()
    assert (rule.vendors, rule.data_classes) == (["google"], ["internal"])
    assert not policies.judge(pool["gemini"], "internal", [rule]).allowed


def test_a_worker_vendor_in_another_case_is_still_blocked(pool):
    Worker.objects.filter(pk=pool["gemini"].pk).update(vendor="Google")
    rule = PolicyRule.objects.create(
        name="no-google", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["google"]
    )

    assert not policies.judge(Worker.objects.get(slug="gemini"), "internal", [rule]).allowed


def test_the_rule_form_says_the_name_is_a_slug_and_why_no_region_is_known(admin):
    worker("replayed", "openai")  # registered workers that declare no region, as the replay pool's
    worker("other", "google")

    html = admin.get(ADD_URL).content.decode()

    assert "A slug: letters, digits, hyphens and underscores, no spaces" in html
    assert "known: none (no registered worker declares a region)" in html
    assert "no worker is registered" not in html
    assert "known: google, openai" in html


def test_the_policy_report_names_the_rule_of_its_own_events_and_lists_its_values(admin, pool):
    created = admin.post(ADD_URL, rule_form(name="no-openai", vendors="OpenAI"))
    assert created.status_code == 302, form_errors(created)

    html = admin.get("/audit/policies/").content.decode()
    row = html[html.index("policyrule.registered") :]
    row = row[: row.index("</tr>")]

    assert "<td>no-openai</td>" in row
    assert "vendors \u2192 openai" in row and "kind \u2192 vendor_blocked" in row
    assert "[&#x27;" not in row and "['" not in row  # lists are not shown as Python writes them
