"""The task list, submission, a task and its live graph, a retry."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from accounts.models import Role
from accounts.roles import EVERYONE, has_role, role_required
from audit.actions import Action
from audit.models import AuditEvent
from audit.services import record_viewed
from operations.compare.side_by_side import compare_link
from operations.saved_views.services import visible_views
from operations.tasks.filters import TaskFilter
from operations.tasks.forms import TaskSubmitForm
from operations.tasks.pagination import CreatedCursorPagination
from review.annotations.services import REVIEWERS, annotations_of
from review.playground.services import PLAYERS
from routing import replay, selectors
from routing.models import Annotation, DataClass, Run, RunStatus, StopReason, Task
from routing.services import SubmissionError, TaskSubmission, task_retry, task_submit
from utilities.pagination import page


@role_required(*EVERYONE)
def task_list(request: HttpRequest) -> HttpResponse:
    tasks = TaskFilter(request.GET, selectors.task_list())
    rows, next_page = page(request, selectors.with_answerers(tasks.qs), CreatedCursorPagination)
    applied = tasks.form.cleaned_data
    names = (
        "q",
        "status",
        "classification",
        "source",
        "worker",
        "vendor",
        "conductor",
        "stop",
        "since",
        "until",
    )
    shown = {"q": "search", "stop": "failure"}
    view_query = request.GET.copy()
    view_query.pop("cursor", None)
    return render(
        request,
        "routing/task_list.html",
        {
            "tasks": rows,
            "next_page": next_page,
            "statuses": RunStatus.choices,
            "classes": DataClass.choices,
            "sources": Task.Source.choices,
            "workers": selectors.worker_slugs(),
            "vendors": selectors.vendor_names(),
            "conductors": selectors.conductor_names(),
            "stops": StopReason.choices,
            "filters": {name: applied.get(name) or "" for name in names},
            # What the list is filtered by, said above it.
            "filtered": [
                (shown.get(name, name), StopReason(applied[name]).label if name == "stop" else applied[name])
                for name in names
                if applied.get(name)
            ],
            "view_query": view_query.urlencode(),
            "saved_views": visible_views(request.user),
        },
    )


@role_required(Role.OPERATOR)
def task_submit_view(request: HttpRequest) -> HttpResponse:
    # Sample tasks: recorded benchmark items the offline replay pool can answer (free text it cannot).
    # ?sample=<n> fills the form with one; posted back with the form, it keeps the item's domain and id
    # while the text is still the item's.
    try:
        samples = replay.sample_items()
    except replay.ReplayDataError:
        samples = []
    chosen_key = (request.POST if request.method == "POST" else request.GET).get("sample", "")
    index = int(chosen_key) if chosen_key.isdecimal() and len(chosen_key) <= 3 else -1
    chosen = samples[index] if 0 <= index < len(samples) else None
    initial = (
        {
            "text": chosen.task,
            "reference": chosen.reference,
            "domain": chosen.domain,
            "classification": DataClass.PUBLIC,
        }
        if chosen is not None
        else {}
    )
    form = TaskSubmitForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        data["reference"] = data.get("reference") or None
        data["idempotency_key"] = data.get("idempotency_key") or None
        # Browsers send a textarea's line breaks as CRLF: the item's text is the same text.
        if chosen is not None and data["text"].replace("\r\n", "\n").strip() == chosen.task.strip():
            data["text"], data["domain"], data["source_item"] = chosen.task, chosen.domain, chosen.id
        try:
            task, created = task_submit(
                submission=TaskSubmission(**data), source=Task.Source.WEB, user=request.user
            )
        except SubmissionError as exc:
            form.add_error(None, str(exc))
        else:
            if not created:
                messages.info(request, "A task with this idempotency key already exists; showing it.")
            return redirect("routing:task-detail", task_id=task.pk)
    return render(
        request,
        "routing/task_submit.html",
        {
            "form": form,
            "samples": [
                {
                    "number": n,
                    "domain": item.domain,
                    "label": replay.sample_label(item),
                    "reference": item.reference,
                }
                for n, item in enumerate(samples)
            ],
            "sample": str(index) if chosen is not None else "",
        },
    )


@role_required(*EVERYONE)
def task_detail(request: HttpRequest, task_id) -> HttpResponse:
    try:
        task = selectors.task_detail(task_id=task_id)
    except Task.DoesNotExist as exc:
        raise Http404("No such task") from exc
    runs = list(task.runs.all())
    record_viewed(request=request, task=task, view="task page")
    return render(
        request,
        "routing/task_detail.html",
        {
            "task": task,
            "runs": runs,
            "scored": scored_as(task, runs),
            "annotations": annotations_of(task),
            "can_review": has_role(request, REVIEWERS),
            "can_play": has_role(request, PLAYERS),
            "verdicts": Annotation.Verdict.choices,
            "compare_url": compare_link(runs),
        },
    )


@role_required(*EVERYONE)
def task_by_short_id(request: HttpRequest, short_id: str) -> HttpResponse:
    """/tasks/<the 8 characters the pages show>/: that task's page; where several tasks start with them,
    the task list searched for them."""
    found = selectors.tasks_by_short_id(short_id)
    if not found:
        raise Http404("No such task")
    if len(found) == 1:
        return redirect("routing:task-detail", task_id=found[0])
    return redirect(f"{reverse('routing:task-list')}?{urlencode({'q': short_id})}")


@require_POST
@role_required(Role.OPERATOR)
def task_retry_view(request: HttpRequest, task_id) -> HttpResponse:
    """Run a failed task again (a retry run, with the active conductor); its failed runs stay."""
    try:
        run = task_retry(task_id=task_id, user=request.user)
    except SubmissionError as exc:
        messages.error(request, f"Not retried: {exc}")
    else:
        messages.success(request, f"Retrying: run {run.pk} is queued.")
    return redirect("routing:task-detail", task_id=task_id)


def scored_as(task: Task, runs: list[Run]) -> dict[str, str] | None:
    """The scorer that graded the task's answer and the answer it read out of it, as the run's end
    recorded them (routing.engine.run_end): what a score of 0 next to a right-looking answer needs."""
    if task.score is None:
        return None
    graded = [str(r.pk) for r in runs if r.kind in (Run.Kind.LIVE, Run.Kind.RETRY)]
    event = (
        AuditEvent.objects.filter(task_id=task.pk, action=Action.RUN_SUCCEEDED, object_id__in=graded)
        .order_by("-id")
        .values_list("payload", flat=True)
        .first()
    )
    if not event:
        return None
    return {"scorer": event.get("scorer") or "", "answer": event.get("extracted_answer") or ""}


@role_required(*EVERYONE)
def task_graph(request: HttpRequest, task_id) -> HttpResponse:
    try:
        task = Task.objects.get(pk=task_id)
    except Task.DoesNotExist as exc:
        raise Http404("No such task") from exc
    return render(request, "routing/task_graph.html", {"task": task})
