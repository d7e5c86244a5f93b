"""The operators' pages: the task list and search, submission, a task, its live graph, workers, the live overview and analytics."""

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
from utilities import params
from utilities.pagination import page

from . import analytics, compare, ops, replay, review, saved_views, selectors
from .filters import FAILED, AttemptFilter, TaskFilter, conductor_names, worker_slugs
from .forms import TaskSubmitForm
from .models import Annotation, Attempt, DataClass, Run, RunStatus, StopReason, Task
from .pagination import AttemptCursorPagination, CreatedCursorPagination
from .playground import PLAYERS
from .services import SubmissionError, TaskSubmission, task_retry, task_submit


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
            "workers": worker_slugs(),
            "vendors": selectors.vendor_names(),
            "conductors": conductor_names(),
            "stops": StopReason.choices,
            "filters": {name: applied.get(name) or "" for name in names},
            # What the list is filtered by, said above it.
            "filtered": [
                (shown.get(name, name), StopReason(applied[name]).label if name == "stop" else applied[name])
                for name in names
                if applied.get(name)
            ],
            "view_query": view_query.urlencode(),
            "saved_views": saved_views.visible_views(request.user),
        },
    )


@role_required(*EVERYONE)
def attempt_list(request: HttpRequest) -> HttpResponse:
    """Provider calls, filtered: where a symptom on the overview (an error rate, an alert) leads."""
    attempts = AttemptFilter(request.GET, selectors.attempt_list())
    rows, next_page = page(request, attempts.qs, AttemptCursorPagination)
    applied = attempts.form.cleaned_data
    names = ("worker", "vendor", "status", "task", "since", "until")
    return render(
        request,
        "routing/attempt_list.html",
        {
            "attempts": rows,
            "next_page": next_page,
            "workers": worker_slugs(),
            "vendors": selectors.vendor_names(),
            "statuses": [*Attempt.Status.choices, (FAILED, "Any error")],
            "filters": {name: applied.get(name) or "" for name in names},
            "filtered": [(name, applied[name]) for name in names if applied.get(name)],
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
            "annotations": review.annotations_of(task),
            "can_review": has_role(request, review.REVIEWERS),
            "can_play": has_role(request, PLAYERS),
            "verdicts": Annotation.Verdict.choices,
            "compare_url": compare.compare_link(runs),
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
def worker_list(request: HttpRequest) -> HttpResponse:
    return render(request, "routing/worker_list.html", {"workers": selectors.worker_list()})


@role_required(*EVERYONE)
def task_graph(request: HttpRequest, task_id) -> HttpResponse:
    try:
        task = Task.objects.get(pk=task_id)
    except Task.DoesNotExist as exc:
        raise Http404("No such task") from exc
    return render(request, "routing/task_graph.html", {"task": task})


@role_required(*EVERYONE)
def ops_overview(request: HttpRequest) -> HttpResponse:
    minutes = params.integer(request.GET, "minutes", default=15, minimum=1, maximum=24 * 60)
    period = params.choice(request.GET, "period", ops.PERIODS) or "hour"
    context = {
        "data": ops.overview(minutes=minutes),
        "history": ops.history(period),
        "period": period,
        "periods": list(ops.PERIODS),
        "queues": ops.queue_depths(),
        "workers_alive": ops.workers_alive(),
        "local_model": ops.local_model_state(),
    }
    template = "routing/_ops_body.html" if request.GET.get("partial") else "routing/ops.html"
    return render(request, template, context)


ANALYTICS_CHARTS = {
    "cost_by_worker": lambda f: analytics.cost_over_time(f, by="worker"),
    "cost_by_vendor": lambda f: analytics.cost_over_time(f, by="vendor"),
    "cost_by_conductor": lambda f: analytics.cost_over_time(f, by="conductor"),
    "accuracy_cost_workers": lambda f: analytics.accuracy_vs_cost(f, by="worker"),
    "accuracy_cost_conductors": lambda f: analytics.accuracy_vs_cost(f, by="conductor"),
    "routing_by_domain": analytics.routing_distribution,
}


@role_required(*EVERYONE)
def analytics_page(request: HttpRequest) -> HttpResponse:
    base = analytics.default_filters(days=7)
    since, until = params.period(request.GET)
    conductors = conductor_names()
    filters = analytics.Filters(
        since=since or base.since,
        until=until or base.until,
        classification=params.choice(request.GET, "classification", DataClass.values),
        conductor=params.choice(request.GET, "conductor", conductors),
        bucket=params.choice(request.GET, "bucket", analytics.BUCKETS),
    )
    bucket = analytics.bucket_name(filters)  # a bucket that does not fit the period: refused here
    chart = params.choice(request.GET, "chart", ANALYTICS_CHARTS)
    if chart:
        response = HttpResponse(analytics.as_csv(ANALYTICS_CHARTS[chart](filters)), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="{chart}.csv"'
        return response
    data = {name: build(filters) for name, build in ANALYTICS_CHARTS.items()}
    return render(
        request,
        "routing/analytics.html",
        {
            "data": data,
            "bucket_s": analytics.bucket_seconds(filters),
            "bucket_label": analytics.BUCKETS[bucket][0],
            "buckets": [(name, label) for name, (label, _, _) in analytics.BUCKETS.items()],
            "filters": filters,
            "classes": DataClass.choices,
            "conductors": conductors,
            "query": request.GET.urlencode(),
        },
    )
