"""Item sets made from the logged record: a task with a reference, a task a reviewer judged, every
usable task of a saved view; the task's dossier says which set it went to and by whom; a purge of the
task deletes the item's words, a legal hold keeps them."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import Role
from audit.models import AuditEvent
from audit.services import Actor, legal_hold_place
from governance.retention import PURGED, task_purge
from operations.saved_views.services import view_save
from review.annotations.services import Verdict, annotation_add
from routing import engine
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json
from training.errors import TrainingError
from training.itemsets.services import tasks_add
from training.models import Item

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")


def logged(server, text: str, answer: str, **fields):
    server.program("conductor", [Reply(plan_json(("alpha", "Answer it", [])))])
    server.program("alpha", [Reply(answer)])
    task, _ = task_submit(submission=TaskSubmission(text=text, **fields), source="api")
    run = task.runs.get()
    engine.execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    return task, run


def test_logged_tasks_with_references_and_verdicts_become_items(live_pool, make_user, page):
    server = live_pool["server"]
    reviewer = make_user("rita", Role.AUDITOR)
    referenced, _ = logged(server, "What is 6 * 7?", "42", reference="42", scorer="numeric", domain="arith")
    judged_right, right_run = logged(
        server, "Summarise: cats sleep a lot.", "Cats sleep much.", domain="summaries"
    )
    judged_wrong, wrong_run = logged(server, "Summarise: dogs bark.", "Birds sing.", domain="summaries")
    unjudged, _ = logged(server, "Tell me a joke.", "No.")
    annotation_add(verdict=Verdict(run_id=right_run.pk, verdict="correct"), user=reviewer)
    annotation_add(verdict=Verdict(run_id=wrong_run.pk, verdict="wrong"), user=reviewer)

    with pytest.raises(TrainingError, match="no reference and no reviewer's verdict"):
        tasks_add(name="ours", tasks=[unjudged], actor=ACTOR)
    version, added, skipped = tasks_add(
        name="ours", tasks=[referenced, judged_right, judged_wrong, unjudged], actor=ACTOR, skip_unusable=True
    )
    assert added == 3 and len(skipped) == 1
    items = {i.source_task_id: i for i in Item.objects.filter(version=version)}
    assert (items[referenced.pk].reference, items[referenced.pk].scorer, items[referenced.pk].kind) == (
        "42",
        "numeric",
        "arith",
    )
    right = items[judged_right.pk]
    assert (right.origin, right.verdict, right.scorer, right.reference) == (
        "review",
        "correct",
        "human",
        "Cats sleep much.",
    )
    wrong = items[judged_wrong.pk]
    assert (wrong.verdict, wrong.reference) == ("wrong", None)
    assert right.source_run_id == right_run.pk

    # The dossier of the task says which set it went to, and by whom.
    auditor = Client()
    auditor.force_login(reviewer)
    dossier = auditor.get(f"/audit/tasks/{referenced.pk}/").content.decode()
    assert "task.added_to_itemset" in dossier and "ours" in dossier


def test_a_saved_view_adds_its_usable_tasks_and_the_task_page_offers_the_set(live_pool, mira, page):
    server = live_pool["server"]
    for n in range(3):
        logged(
            server,
            f"Convert {n} km to m.",
            f"{n * 1000}",
            reference=str(n * 1000),
            scorer="numeric",
            domain="units",
        )
    logged(server, "Convert nothing.", "?", domain="units")
    view = view_save(user=mira, name="units", query="q=Convert", shared=False)
    response = page.post("/training/itemsets/add-view/", {"name": "units-set", "view": view.pk, "kind": ""})
    assert response.status_code == 302, response.content
    assert Item.objects.filter(version__item_set__name="units-set").count() == 3
    event = AuditEvent.objects.get(action="itemset.items_added")
    assert event.payload["saved_view"] == view.pk and event.actor_name == "mira"

    task, _ = logged(server, "What is 2 + 2?", "4", reference="4", scorer="numeric")
    assert 'id="add-to-itemset"' in page.get(f"/tasks/{task.pk}/").content.decode()
    form = page.get(f"/training/itemsets/add/?task={task.pk}")
    assert form.status_code == 200
    added = page.post("/training/itemsets/add/", {"name": "units-set", "task": task.pk, "kind": "arith"})
    assert added.status_code == 302
    assert Item.objects.get(source_task=task).kind == "arith"


def test_a_purge_deletes_the_items_words_and_a_hold_keeps_them(live_pool, settings):
    server = live_pool["server"]
    purged, _ = logged(server, "Confidential question 1?", "a", reference="a")
    held, _ = logged(server, "Confidential question 2?", "b", reference="b")
    tasks_add(name="secret", tasks=[purged, held], actor=ACTOR)
    legal_hold_place(task=held, actor=ACTOR, reason="litigation")
    now = timezone.now()
    for task in (purged, held):
        task.refresh_from_db()
        task_purge(task=task, actor=Actor.service("retention"), now=now)
    gone = Item.objects.get(source_task=purged)
    assert (gone.text, gone.reference, gone.purged_at) == (PURGED, None, now)
    kept = Item.objects.get(source_task=held)
    assert kept.text == "Confidential question 2?" and kept.purged_at is None
    event = AuditEvent.objects.get(action="itemset.items_purged")
    assert event.task_id == purged.pk
