"""The task list's search: full-text over task text (served by a GIN index), or a task id."""

import pytest
from django.db import connection

from routing import selectors
from routing.models import Task
from routing.services import TaskSubmission, task_submit


def submit(text: str) -> Task:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.CLI)
    return task


@pytest.mark.django_db
def test_search_matches_words_in_any_form_phrases_exclusions_and_ids():
    trains = submit("Two trains leave the stations at noon; when do they meet?")
    apples = submit("Alice has 3 apples and buys 5 more apples.")
    code = submit("What does f(x) return for the list [1, 2, 3]?")

    def found(query):
        return set(selectors.task_search(selectors.task_list(), query).values_list("pk", flat=True))

    assert found("train") == {trains.pk}  # stemmed: "trains" matches "train"
    assert found("apples alice") == {apples.pk}
    assert found('"buys 5 more"') == {apples.pk}
    assert found("apples -alice") == set()
    assert found("train or list") == {trains.pk, code.pk}
    assert found(str(code.pk)) == {code.pk}
    assert found("zeppelin") == set()


@pytest.mark.django_db
def test_the_short_id_the_pages_show_finds_its_task():
    tasks = [submit(f"Question number {n}") for n in range(30)]
    target = tasks[7]

    def found(query):
        return set(selectors.task_search(selectors.task_list(), query).values_list("pk", flat=True))

    short = str(target.pk)[:8]  # as the pages show it
    assert found(short) == {target.pk}
    assert found(short.upper()) == {target.pk}
    assert found(str(target.pk)[:13]) == {target.pk}  # with its dash
    assert found(target.pk.hex[:20]) == {target.pk}
    # A short prefix finds every task it starts, and only those.
    prefix = str(target.pk)[:4]
    assert found(prefix) == {t.pk for t in tasks if str(t.pk).startswith(prefix)}
    # Not an id's beginning: an ordinary word search, which finds nothing here.
    assert found("zz" + short) == set()
    assert found("numbered") == {t.pk for t in tasks}  # words still work


@pytest.mark.django_db
def test_a_word_that_looks_like_an_id_finds_by_either():
    cafe = submit("Which cafe opens first on Sunday?")
    other = submit("Another question entirely")
    found = set(selectors.task_search(selectors.task_list(), "cafe").values_list("pk", flat=True))
    assert cafe.pk in found
    assert found - {cafe.pk} == ({other.pk} if other.pk.hex.startswith("cafe") else set())


@pytest.mark.django_db
def test_the_search_can_use_the_full_text_index():
    submit("A question about prime numbers")
    with connection.cursor() as cursor:
        # A small table would be scanned otherwise, or walked in created_at order through its btree
        # index with the search as a filter (the planner's pick once its statistics say "tiny").
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
    plan = selectors.task_search(selectors.task_list(), "prime").explain()
    assert "task_text_search" in plan
