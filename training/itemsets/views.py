"""The item sets' pages: the list with the upload form, a set (its versions, items, manifest, export),
and "add to an item set" for a logged task or a saved view of the task list. Writes go through
training.itemsets.services; ML staff write, auditors read."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib import messages
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.roles import has_role, role_required
from audit.services import Actor
from operations.saved_views.services import visible_views
from routing.errors import ServiceError
from routing.models import Task
from utilities import params

from ..models import Item, ItemSet, ItemSetVersion, ItemSplit
from ..views import READERS, WRITERS
from . import rows, services
from .forms import AddTaskForm, AddViewForm, UploadForm
from .selectors import view_tasks

ITEMS_SHOWN = 200
VERSION_PARAM = "set_version"  # ?set_version=N: a version other than the latest


@require_GET
@role_required(*READERS)
def itemset_list(request: HttpRequest) -> HttpResponse:
    return _list_page(request, UploadForm())


def _list_page(request: HttpRequest, form: UploadForm, status: int = 200) -> HttpResponse:
    # Each set's latest version (DISTINCT ON) and their item counts: two queries, not two per set.
    latest = list(
        ItemSetVersion.objects.select_related("item_set", "item_set__created_by")
        .order_by("item_set__name", "-number")
        .distinct("item_set__name")
    )
    counts = dict(
        Item.objects.filter(version__in=latest)
        .values_list("version")
        .annotate(n=Count("id"))
        .values_list("version", "n")
    )
    sets = [{"set": v.item_set, "version": v, "items": counts.get(v.pk, 0)} for v in latest]
    return render(
        request,
        "training/itemset_list.html",
        {
            "sets": sets,
            "form": form,
            "can_write": has_role(request, WRITERS),
            "columns": rows.COLUMNS,
            "scorers": rows.ITEM_SCORERS,
            "max_rows": rows.MAX_ROWS,
        },
        status=status,
    )


@require_POST
@role_required(*WRITERS)
def itemset_upload(request: HttpRequest) -> HttpResponse:
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        return _list_page(request, form, status=400)
    upload = form.cleaned_data["file"]
    if upload.size > rows.MAX_FILE_BYTES:
        form.add_error("file", f"The file has {upload.size:,} bytes; at most {rows.MAX_FILE_BYTES:,}.")
        return _list_page(request, form, status=400)
    content = upload.read()
    try:
        checked = rows.read_file(content, upload.name or "")
        version, added = services.items_upload(
            name=form.cleaned_data["name"],
            rows=checked,
            filename=upload.name or "",
            content_sha256=hashlib.sha256(content).hexdigest(),
            description=form.cleaned_data["description"],
            actor=Actor.for_user(request.user),
            user=request.user,
        )
    except rows.FileRefused as exc:
        form.add_error("file", str(exc))
        return _list_page(request, form, status=400)
    except ServiceError as exc:
        form.add_error(None, str(exc))
        return _list_page(request, form, status=400)
    messages.success(request, f"{added} items added to {version}.")
    return redirect("training:itemset", name=version.item_set.name)


@require_GET
@role_required(*READERS)
def itemset_template(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(rows.template_csv(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="items-template.csv"'
    return response


@require_GET
@role_required(*READERS)
def itemset_detail(request: HttpRequest, name: str) -> HttpResponse:
    item_set = get_object_or_404(ItemSet, name=name)
    versions = list(item_set.versions.order_by("-number"))
    number = params.integer(
        request.GET,
        VERSION_PARAM,
        default=versions[0].number if versions else 1,
        minimum=1,
        maximum=2**31 - 1,
    )
    version = next((v for v in versions if v.number == number), None)
    if version is None:
        raise Http404("no such version")
    split = params.choice(request.GET, "split", ItemSplit.values)
    items = version.items.select_related("source_task", "added_by").order_by("key")
    if split:
        items = items.filter(split=split)
    manifest = version.manifest if version.frozen else services.manifest_of(version)
    return render(
        request,
        "training/itemset_detail.html",
        {
            "item_set": item_set,
            "versions": versions,
            "version": version,
            "manifest": manifest,
            "items": items[:ITEMS_SHOWN],
            "count": items.count(),
            "shown": ITEMS_SHOWN,
            "split": split,
            "splits": ItemSplit.values,
            "used": _used_by(version),
        },
    )


def _used_by(version: Any) -> dict[str, Any]:
    return {
        "rollouts": list(version.rollout_batches.order_by("-pk").values_list("pk", flat=True)[:20]),
        "evaluations": list(version.evaluations.order_by("-pk").values_list("pk", flat=True)[:20]),
    }


@require_GET
@role_required(*READERS)
def itemset_export(request: HttpRequest, name: str) -> StreamingHttpResponse:
    """The version as JSON Lines (what imports again to the same content hash); audited."""
    return export_response(_version(request, name), Actor.for_user(request.user), what="items.jsonl")


def export_response(version: Any, actor: Actor, *, what: str) -> StreamingHttpResponse:
    """A version's JSON Lines as a download, its export audited (the page's and the API's)."""
    services.itemset_exported(version=version, actor=actor, what=what)
    lines = (line + "\n" for line in services.version_lines(version))
    response = StreamingHttpResponse(lines, content_type="application/jsonl; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="{version.item_set.name}-v{version.number}.jsonl"'
    )
    return response


@require_GET
@role_required(*READERS)
def itemset_manifest(request: HttpRequest, name: str) -> HttpResponse:
    version = _version(request, name)
    manifest = version.manifest if version.frozen else services.manifest_of(version)
    response = HttpResponse(
        json.dumps(manifest, indent=2, ensure_ascii=False), content_type="application/json"
    )
    response["Content-Disposition"] = (
        f'attachment; filename="{version.item_set.name}-v{version.number}.manifest.json"'
    )
    return response


def _version(request: HttpRequest, name: str) -> Any:
    item_set = get_object_or_404(ItemSet, name=name)
    default = item_set.versions.order_by("-number").values_list("number", flat=True).first() or 1
    number = params.integer(request.GET, VERSION_PARAM, default=default, minimum=1, maximum=2**31 - 1)
    return get_object_or_404(item_set.versions.select_related("item_set"), number=number)


@require_http_methods(["GET", "POST"])
@role_required(*WRITERS)
def itemset_add_task(request: HttpRequest) -> HttpResponse:
    """A logged task into an item set: the form (GET ?task=<id>), then the addition (POST)."""
    if request.method == "POST":
        form = AddTaskForm(request.POST)
        task = Task.objects.filter(pk=request.POST.get("task")).first() if form.is_valid() else None
    else:
        task_id = params.uuid(request.GET, "task")
        task = Task.objects.filter(pk=task_id).first() if task_id else None
        form = AddTaskForm(initial={"task": task.pk if task else None, "kind": task.domain if task else ""})
    if task is None:
        if request.method == "GET":  # no task asked for, or none such: how to get here with one
            missing = request.GET.get("task", "")
            context = {"form": None, "task": None, "names": [], "missing": missing}
            return render(request, "training/itemset_add.html", context)
        raise Http404("no such task")
    if request.method == "POST" and form.is_valid():
        try:
            version, _added, _skipped = services.tasks_add(
                name=form.cleaned_data["name"],
                tasks=[task],
                kind=form.cleaned_data["kind"],
                actor=Actor.for_user(request.user),
                user=request.user,
            )
        except ServiceError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Task {str(task.pk)[:8]} added to {version}.")
            return redirect("training:itemset", name=version.item_set.name)
    return render(
        request,
        "training/itemset_add.html",
        {
            "form": form,
            "task": task,
            "names": ItemSet.objects.order_by("name").values_list("name", flat=True),
        },
        status=400 if form.errors else 200,
    )


@require_POST
@role_required(*WRITERS)
def itemset_add_view(request: HttpRequest) -> HttpResponse:
    """Every task of a saved view of the task list with a reference or a reviewer's verdict."""
    form = AddViewForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Not added: " + "; ".join(" ".join(e) for e in form.errors.values()))
        return redirect("training:itemsets")
    view = visible_views(request.user).filter(pk=form.cleaned_data["view"]).first()
    if view is None:
        raise Http404("no such view")
    try:
        version, added, skipped = services.tasks_add(
            name=form.cleaned_data["name"],
            tasks=view_tasks(view),
            kind=form.cleaned_data["kind"],
            skip_unusable=True,
            actor=Actor.for_user(request.user),
            user=request.user,
            how={"saved_view": view.pk, "view_name": view.name},
        )
    except ServiceError as exc:
        messages.error(request, f"Not added: {exc}")
        return redirect("training:itemsets")
    messages.success(
        request,
        f"{added} tasks of the view {view.name!r} added to {version}; {len(skipped)} had no reference or verdict.",
    )
    return redirect("training:itemset", name=version.item_set.name)
