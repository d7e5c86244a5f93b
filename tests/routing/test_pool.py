"""The worker pool and conductor versions: registration, the replay pool, activation, the admin."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO

import litellm
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEvent
from audit.services import Actor
from routing import replay
from routing.models import ConductorVersion, Worker
from routing.services import SubmissionError, conductor_activate, conductor_active, worker_register

pytestmark = pytest.mark.django_db

OPERATOR = Actor.service("test")


def register(*args: str) -> str:
    out = StringIO()
    call_command("register_worker", *args, stdout=out)
    return out.getvalue()


def events(action: str, obj=None):
    qs = AuditEvent.objects.filter(action=action)
    if obj is not None:
        qs = qs.filter(object_type=obj._meta.model_name, object_id=str(obj.pk))
    return qs


# --- register_worker / worker_register --------------------------------------------------------


def test_register_worker_takes_prices_and_context_window_from_litellms_cost_map():
    out = register("mini", "openai/gpt-4o-mini", "--vendor", "openai")

    worker = Worker.objects.get(slug="mini")
    assert worker.litellm_model == "openai/gpt-4o-mini"
    assert worker.vendor == "openai"
    assert worker.price_source == Worker.PriceSource.LITELLM
    assert worker.input_usd_per_mtok == Decimal("0.15")
    assert worker.output_usd_per_mtok == Decimal("0.6")
    assert worker.context_window == litellm.model_cost["gpt-4o-mini"]["max_input_tokens"]
    assert worker.data_classes == ["public", "internal"]
    assert "registered mini" in out
    assert "litellm cost map" in out
    event = events("worker.registered", worker).get()
    assert event.actor_type == AuditEvent.ActorType.SERVICE
    assert event.actor_name == "register_worker"
    assert Decimal(event.payload["fields"]["input_usd_per_mtok"]) == Decimal("0.15")
    assert event.payload["fields"]["price_source"] == "litellm"


def test_context_window_comes_from_the_map_not_a_default():
    worker, created = worker_register(
        slug="turbo", litellm_model="openai/gpt-3.5-turbo-0125", vendor="openai", actor=OPERATOR
    )
    assert created
    assert worker.context_window == 16385  # not the 128k fallback
    assert (worker.input_usd_per_mtok, worker.output_usd_per_mtok) == (Decimal("0.5"), Decimal("1.5"))
    worker, _ = worker_register(
        slug="turbo-8k",
        litellm_model="openai/gpt-3.5-turbo-0125",
        vendor="openai",
        actor=OPERATOR,
        context_window=8000,
    )
    assert worker.context_window == 8000


def test_both_prices_given_override_the_map():
    register(
        "mini-deal",
        "openai/gpt-4o-mini",
        "--vendor",
        "openai",
        "--input-price",
        "0.1",
        "--output-price",
        "0.4",
        "--data-classes",
        "public",
    )
    worker = Worker.objects.get(slug="mini-deal")
    assert worker.price_source == Worker.PriceSource.OVERRIDE
    assert (worker.input_usd_per_mtok, worker.output_usd_per_mtok) == (Decimal("0.1"), Decimal("0.4"))
    assert worker.data_classes == ["public"]


def test_unknown_model_with_both_prices_is_registered_as_override():
    worker, created = worker_register(
        slug="local-qwen",
        litellm_model="hosted_vllm/qwen-unknown-xyz",
        vendor="self-hosted",
        actor=OPERATOR,
        api_base="http://127.0.0.1:9/v1",
        input_usd_per_mtok=Decimal("0"),
        output_usd_per_mtok=Decimal("0"),
        self_hosted=True,
    )
    assert created
    assert worker.price_source == Worker.PriceSource.OVERRIDE
    assert worker.context_window == 128_000
    assert worker.self_hosted


def test_unknown_model_without_prices_is_refused():
    with pytest.raises(CommandError, match=r"give both prices for hosted_vllm/nope-xyz: .*does not know it"):
        register("nope", "hosted_vllm/nope-xyz", "--vendor", "self-hosted")
    with pytest.raises(SubmissionError, match=r"litellm's cost map does not know it"):
        worker_register(slug="nope", litellm_model="hosted_vllm/nope-xyz", vendor="x", actor=OPERATOR)
    assert not Worker.objects.filter(slug="nope").exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("model", "price_flag"),
    [
        ("openai/gpt-4o-mini", "--input-price"),
        ("openai/gpt-4o-mini", "--output-price"),
        ("hosted_vllm/nope-xyz", "--input-price"),
    ],
)
def test_one_price_alone_is_refused(model, price_flag):
    with pytest.raises(CommandError, match=r"give both prices for"):
        register("half", model, "--vendor", "openai", price_flag, "0.2")
    assert not Worker.objects.filter(slug="half").exists()


def test_one_price_alone_names_the_ambiguity_for_a_known_model():
    with pytest.raises(SubmissionError, match=r"one price alone is ambiguous"):
        worker_register(
            slug="half",
            litellm_model="openai/gpt-4o-mini",
            vendor="openai",
            actor=OPERATOR,
            input_usd_per_mtok=Decimal("0.2"),
        )


def test_unknown_data_class_is_refused():
    with pytest.raises(CommandError, match=r"unknown data classes: \['secret'\]"):
        register("mini", "openai/gpt-4o-mini", "--vendor", "openai", "--data-classes", "public,secret")
    assert not Worker.objects.exists()


def test_reregistering_audits_exactly_what_changed_and_nothing_when_unchanged():
    register("mini", "openai/gpt-4o-mini", "--vendor", "openai")
    worker = Worker.objects.get(slug="mini")

    out = register(
        "mini", "openai/gpt-4o-mini", "--vendor", "openai", "--region", "eu", "--data-classes", "public"
    )
    assert "updated mini" in out
    updated = events("worker.updated", worker).get()
    assert updated.payload["slug"] == "mini"
    assert updated.payload["fields"] == {
        "region": {"from": "", "to": "eu"},
        "data_classes": {"from": ["public", "internal"], "to": ["public"]},
    }
    worker.refresh_from_db()
    assert worker.region == "eu"
    assert worker.data_classes == ["public"]
    assert Worker.objects.count() == 1

    before = AuditEvent.objects.count()
    register("mini", "openai/gpt-4o-mini", "--vendor", "openai", "--region", "eu", "--data-classes", "public")
    assert AuditEvent.objects.count() == before
    assert events("worker.updated", worker).count() == 1


def test_switching_to_override_prices_records_the_old_and_new_prices():
    worker, _ = worker_register(
        slug="mini", litellm_model="openai/gpt-4o-mini", vendor="openai", actor=OPERATOR
    )
    worker_register(
        slug="mini",
        litellm_model="openai/gpt-4o-mini",
        vendor="openai",
        actor=OPERATOR,
        input_usd_per_mtok=Decimal("0.15"),
        output_usd_per_mtok=Decimal("0.5"),
    )
    changed = events("worker.updated", worker).get().payload["fields"]
    assert changed == {
        "output_usd_per_mtok": {"from": "0.6000000000", "to": "0.5"},
        "price_source": {"from": "litellm", "to": "override"},
    }


# --- load_replay_pool -------------------------------------------------------------------------


def test_load_replay_pool_registers_one_worker_per_recorded_model():
    models = replay.load_models()
    assert len(models) == 11

    call_command("load_replay_pool", verbosity=0)

    workers = {w.slug: w for w in Worker.objects.all()}
    assert len(workers) == 11
    for name, info in models.items():
        worker = workers[name.lower()]
        assert worker.display_name == name
        assert worker.litellm_model == f"replay/{name}"
        assert worker.vendor == info["provider"]
        assert worker.price_source == Worker.PriceSource.LIST
        assert worker.input_usd_per_mtok == Decimal(str(info["input_usd_per_mtok"]))
        assert worker.output_usd_per_mtok == Decimal(str(info["output_usd_per_mtok"]))
    assert workers["gpt-4o-mini-2024-07-18"].input_usd_per_mtok == Decimal("0.15")
    assert events("worker.registered").count() == 11
    assert ConductorVersion.objects.get(is_active=True).name == "static-v1"


def test_load_replay_pool_twice_changes_nothing():
    call_command("load_replay_pool", verbosity=0)
    workers_before = list(Worker.objects.values_list("pk", "updated_at"))
    events_before = AuditEvent.objects.count()

    out = StringIO()
    call_command("load_replay_pool", verbosity=1, stdout=out)

    assert list(Worker.objects.values_list("pk", "updated_at")) == workers_before
    assert AuditEvent.objects.count() == events_before
    assert "registered" not in out.getvalue().replace("replay workers", "")
    assert "11 replay workers; active conductor static-v1" in out.getvalue()


def test_load_replay_pool_without_models_json_names_it(settings, tmp_path):
    settings.REPLAY_DIR = tmp_path
    with pytest.raises(CommandError, match=r"models\.json"):
        call_command("load_replay_pool", verbosity=0)
    assert not Worker.objects.exists()


def test_load_replay_pool_without_a_replay_dir_says_so(settings):
    settings.REPLAY_DIR = None
    with pytest.raises(CommandError, match=r"CONDUCTOR_REPLAY_DIR is not set"):
        call_command("load_replay_pool", verbosity=0)


# --- conductor versions -----------------------------------------------------------------------


def test_conductor_active_creates_the_static_baseline_once():
    assert not ConductorVersion.objects.exists()

    version = conductor_active()

    assert version.name == "static-v1"
    assert version.backend == ConductorVersion.Backend.STATIC
    assert version.is_active
    assert version.config  # the default rules
    event = events("conductor.activated", version).get()
    assert event.actor_type == AuditEvent.ActorType.SERVICE
    assert event.actor_name == "setup"
    assert event.payload["name"] == "static-v1"

    again = conductor_active()
    assert again.pk == version.pk
    assert ConductorVersion.objects.count() == 1
    assert events("conductor.activated").count() == 1


def test_conductor_active_returns_an_existing_active_version():
    llm = ConductorVersion.objects.create(name="llm-v1", backend=ConductorVersion.Backend.LLM, is_active=True)
    assert conductor_active().pk == llm.pk
    assert not ConductorVersion.objects.filter(name="static-v1").exists()
    assert not AuditEvent.objects.exists()


def test_conductor_activate_switches_the_single_active_version_and_audits_it():
    static = conductor_active()
    user = get_user_model().objects.create_user("ops", password="x" * 12)
    llm = ConductorVersion.objects.create(name="llm-v2", backend=ConductorVersion.Backend.LLM)

    result = conductor_activate(version=llm, actor=Actor.for_user(user))

    assert result.is_active
    assert list(ConductorVersion.objects.filter(is_active=True).values_list("name", flat=True)) == ["llm-v2"]
    static.refresh_from_db()
    assert not static.is_active
    assert conductor_active().pk == llm.pk
    event = events("conductor.activated", llm).get()
    assert event.actor_type == AuditEvent.ActorType.USER
    assert event.actor_id == str(user.pk)
    assert event.actor_name == "ops"
    assert event.payload == {"name": "llm-v2", "backend": "llm", "previous": "static-v1"}

    # And back.
    conductor_activate(version=static, actor=OPERATOR)
    assert list(ConductorVersion.objects.filter(is_active=True).values_list("name", flat=True)) == [
        "static-v1"
    ]
    assert events("conductor.activated", static).last().payload["previous"] == "llm-v2"


# --- admin ------------------------------------------------------------------------------------


@pytest.fixture
def admin_client_for(client):
    user = get_user_model().objects.create_superuser("root", email="", password="y" * 12)
    client.force_login(user)
    return client, user


def worker_form_data(worker: Worker, **changes) -> dict:
    data = {
        "slug": worker.slug,
        "display_name": worker.display_name,
        "litellm_model": worker.litellm_model,
        "api_base": worker.api_base,
        "api_key_env": worker.api_key_env,
        "vendor": worker.vendor,
        "region": worker.region,
        "input_usd_per_mtok": str(worker.input_usd_per_mtok),
        "output_usd_per_mtok": str(worker.output_usd_per_mtok),
        "price_source": worker.price_source,
        "context_window": str(worker.context_window),
        "data_classes": ",".join(worker.data_classes),
        # The field has a callable default, so the form also carries its initial value in a hidden input.
        "initial-data_classes": ",".join(worker.data_classes),
        "description": worker.description,
        "_save": "Save",
    }
    if worker.self_hosted:
        data["self_hosted"] = "on"
    if worker.enabled:
        data["enabled"] = "on"
    data.update(changes)
    return data


def test_admin_save_writes_an_audit_event_with_the_user_as_actor(admin_client_for):
    client, user = admin_client_for
    worker, _ = worker_register(
        slug="mini", litellm_model="openai/gpt-4o-mini", vendor="openai", actor=OPERATOR
    )
    url = f"/admin/routing/worker/{worker.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    # The full form, as a browser sends it (an unchecked checkbox sends nothing).
    assert b'name="initial-data_classes"' in page.content
    rendered = {bf.html_name for bf in page.context["adminform"].form} | {"initial-data_classes"}
    assert set(worker_form_data(worker)) - {"_save"} == rendered - {"self_hosted", "weak"}

    response = client.post(url, worker_form_data(worker, vendor="azure", input_usd_per_mtok="0.2"))

    assert response.status_code == 302, (
        response.context["adminform"].form.errors if response.context else response
    )
    worker.refresh_from_db()
    assert worker.vendor == "azure"
    assert worker.input_usd_per_mtok == Decimal("0.2")
    event = events("worker.updated", worker).get()
    assert event.actor_type == AuditEvent.ActorType.USER
    assert event.actor_id == str(user.pk)
    assert event.actor_name == "root"
    assert event.payload["via"] == "admin"
    assert set(event.payload["changed"]) == {"vendor", "input_usd_per_mtok"}
    assert event.payload["changed"]["vendor"] == "azure"


def test_admin_offers_no_delete(admin_client_for):
    client, _ = admin_client_for
    worker, _ = worker_register(
        slug="mini", litellm_model="openai/gpt-4o-mini", vendor="openai", actor=OPERATOR
    )
    version = conductor_active()

    for model, pk in (("worker", worker.pk), ("conductorversion", version.pk)):
        change = client.get(f"/admin/routing/{model}/{pk}/change/")
        assert change.status_code == 200
        assert b"deletelink" not in change.content
        assert client.get(f"/admin/routing/{model}/{pk}/delete/").status_code == 403
        assert client.post(f"/admin/routing/{model}/{pk}/delete/", {"post": "yes"}).status_code == 403
        changelist = client.get(f"/admin/routing/{model}/")
        assert changelist.status_code == 200
        assert b"delete_selected" not in changelist.content
        bulk = client.post(
            f"/admin/routing/{model}/", {"action": "delete_selected", "_selected_action": [pk], "post": "yes"}
        )
        assert bulk.status_code in (200, 302)

    assert Worker.objects.filter(pk=worker.pk).exists()
    assert ConductorVersion.objects.filter(pk=version.pk).exists()
