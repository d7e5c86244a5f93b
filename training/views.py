"""ML staff's pages: conductor versions, rollouts, datasets, training jobs and evaluations.

Every change goes through training.services (one transaction and an audit event each); these views
check the role and the form, call the service and redirect. Auditors may read the pages.

The pages share one home page with every form on it (a refused form re-renders that page with its
errors), so they share its context builder, here. The actions on conductor versions (promote, roll
back, shadow, evaluate) are in training.version_views, what the pages say of a job's or an
evaluation's state in training.page_state; the work itself is in the services package.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from accounts.models import Role
from accounts.roles import has_role, request_roles, role_required
from audit.services import Actor
from routing.errors import ServiceError
from routing.models import ConductorVersion
from routing.services import conductor_active
from training import durations, page_state, quotas, services
from utilities import params

from .forms import DatasetBuildForm, EvaluateForm, JobStartForm, RolloutsForm
from .itemsets.selectors import split_ids
from .models import Dataset, Evaluation, JobStatus, RolloutBatch, TrainingJob
from .rewards import RewardConfig
from .services.evaluations import BOOTSTRAP_RESAMPLES

ITEMS_SHOWN = 100  # of the items won, and of those lost, on an evaluation's page

READERS = (Role.ML_STAFF, Role.AUDITOR)
WRITERS = (Role.ML_STAFF,)
LIST_SIZE = 50
METRICS_PER_POLL = 2000
LOG_TAIL_CHARS = 8000


# --- Pages -----------------------------------------------------------------------------------


def home_page(request: HttpRequest, **forms: Any) -> HttpResponse:
    """The training overview, with the three launch forms (bound ones carry their errors), and the
    preview a "Preview" button asked for (rollouts_preview, evaluate_preview)."""
    conductor_active()  # the static baseline exists from the first look on
    context = {
        "versions": ConductorVersion.objects.order_by("-created_at"),
        "jobs": TrainingJob.objects.select_related("dataset", "candidate")[:LIST_SIZE],
        "datasets": Dataset.objects.all()[:LIST_SIZE],
        "batches": RolloutBatch.objects.select_related("conductor_version")[:LIST_SIZE],
        "evaluations": Evaluation.objects.select_related("candidate", "baseline")[:LIST_SIZE],
        "job_form": forms.get("job_form") or JobStartForm(),
        "rollouts_form": forms.get("rollouts_form") or RolloutsForm(),
        "dataset_form": forms.get("dataset_form") or DatasetBuildForm(),
        "evaluate_form": EvaluateForm(),
        "rollouts_preview": forms.get("rollouts_preview"),
        "evaluate_preview": forms.get("evaluate_preview"),
        "max_runs_per_request": quotas.MAX_RUNS_PER_REQUEST,
        "max_queued_runs_per_user": quotas.max_queued_runs_per_user(),
        "can_write": has_role(request, WRITERS),
        "rollback": dict(zip(("current", "previous"), services.rollback_target(), strict=True)),
    }
    return render(request, "training/home.html", context)


@require_GET
@role_required(*READERS)
def home(request: HttpRequest) -> HttpResponse:
    return home_page(request)


def _stamp(moment: datetime | None) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _job_state(job: TrainingJob, after: int) -> dict[str, Any]:
    metrics = job.metrics.filter(step__gt=after).order_by("step", "id")[:METRICS_PER_POLL]
    return {
        "status": job.status,
        "status_label": job.get_status_display(),
        "banner": page_state.job_banner(job),
        "phase": job.phase if job.status == JobStatus.RUNNING else "",
        "step": job.step,
        "total_steps": job.total_steps,
        "progress": job.progress,
        "finished": job.finished,
        "metrics": [{"step": m.step, "values": m.values} for m in metrics],
        "log_tail": job.log[-LOG_TAIL_CHARS:],
        "error": job.error,
        "artifact_path": job.artifact_path,
        "artifacts": [
            {
                "name": f["name"],
                "size": f["size"],
                "url": reverse("training:job-artifact", args=[job.pk, f["name"]]),
            }
            for f in (_artifact_files(job) if job.finished else [])
        ],
        "started_at": _stamp(job.started_at),
        "finished_at": _stamp(job.finished_at),
        "candidate": (
            {"name": job.candidate.name, "url": reverse("training:home") + f"#version-{job.candidate.pk}"}
            if job.candidate_id
            else None
        ),
        "candidate_note": page_state.candidate_note(job),
    }


@require_GET
@role_required(*READERS)
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(TrainingJob.objects.select_related("dataset", "candidate"), pk=job_id)
    state = _job_state(job, after=-1)
    state["progress_url"] = reverse("training:job-progress", args=[job.pk])
    return render(
        request,
        "training/job_detail.html",
        {
            "job": job,
            "state": state,
            "percent": round(job.progress * 100, 1),
            "artifacts": _artifact_files(job),
            "can_write": has_role(request, WRITERS),
            # The learned policy's cross-validated accuracy/cost curve, against the fixed workflows.
            "frontier": (job.candidate.config.get("frontier") or None) if job.candidate else None,
        },
    )


@require_GET
@role_required(*READERS)
def job_progress(request: HttpRequest, job_id: int) -> JsonResponse:
    """The job's state and the metric points logged after step `after` (all of them without it)."""
    job = get_object_or_404(TrainingJob.objects.select_related("candidate"), pk=job_id)
    after = params.integer(
        request.GET, "after", default=-1, minimum=-1, maximum=2**31 - 1
    )  # an integer column
    return JsonResponse(_job_state(job, after=after))


@require_GET
@role_required(*READERS)
def dataset_detail(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset, pk=dataset_id)
    try:
        files = services.dataset_files(dataset)
    except ServiceError as exc:
        files = {}
        messages.error(request, f"The dataset's files cannot be listed: {exc}")
    rows = [{"name": name, "exists": Path(path).is_file()} for name, path in files.items()]
    for row in rows:
        row["size"] = Path(files[row["name"]]).stat().st_size if row["exists"] else None
    return render(
        request,
        "training/dataset_detail.html",
        {
            "dataset": dataset,
            # Pairs: `dataset.filter.items` in a template would be the filter's "items" key.
            "filter_rows": list((dataset.filter or {}).items()),
            "files": rows,
            "source_runs": len(dataset.source_run_ids),
            "jobs": dataset.jobs.all(),
            "preview": _preview(request, dataset) if files else [],
        },
    )


def _preview(request: HttpRequest, dataset: Dataset) -> list[dict[str, Any]]:
    try:
        return services.dataset_preview(dataset)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:  # a file edited or damaged by hand
        messages.error(request, f"The training split cannot be previewed: {type(exc).__name__}: {exc}")
        return []


@require_GET
@role_required(*READERS)
def dataset_file(request: HttpRequest, dataset_id: int, name: str) -> FileResponse:
    """One of the dataset's files, by the name dataset_files gives it; nothing else."""
    dataset = get_object_or_404(Dataset, pk=dataset_id)
    try:
        files = services.dataset_files(dataset)
    except ServiceError as exc:
        raise Http404("no files for this dataset") from exc
    if name not in files:
        raise Http404("no such file in this dataset")
    return _send(Path(files[name]), name)


@require_GET
@role_required(*READERS)
def evaluation_detail(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    evaluation = get_object_or_404(
        Evaluation.objects.select_related("candidate", "baseline"), pk=evaluation_id
    )
    if evaluation.status == JobStatus.RUNNING:
        # The results so far, computed for this page (reads only: the evaluation finishes when its last
        # run ends).
        evaluation.results = services.evaluation_summary(evaluation)
    results = evaluation.results or {}
    sides = []
    for side, version in (("candidate", evaluation.candidate), ("baseline", evaluation.baseline)):
        row = results.get(side) or {}
        sides.append({**row, "side": side, "conductor": version})
    chart = [
        {
            "side": row["side"],
            "name": row.get("version") or row["conductor"].name,
            "accuracy": row.get("accuracy"),
            "usd_per_1000": row.get("usd_per_1000"),
            "n": row.get("n"),
            "total": row.get("total"),
        }
        for row in sides
        if row.get("accuracy") is not None and row.get("usd_per_1000") is not None
    ]
    comparison = services.evaluation_comparison(evaluation)
    progress = durations.evaluation_progress(evaluation)
    can_promote = (
        has_role(request, WRITERS)
        and evaluation.status == JobStatus.SUCCEEDED
        and not evaluation.candidate.is_active
    )
    return render(
        request,
        "training/evaluation_detail.html",
        {
            "evaluation": evaluation,
            "banner": page_state.evaluation_banner(evaluation, sides),
            "sides": sides,
            "chart": chart,
            "refresh": evaluation.status in (JobStatus.QUEUED, JobStatus.RUNNING),
            "progress": progress,
            "duration": durations.evaluation_duration(evaluation, progress),
            "comparison": comparison,
            "item_lists": [("Won", comparison.won, "won"), ("Lost", comparison.lost, "lost")],
            "item_limit": ITEMS_SHOWN,
            "resamples": f"{BOOTSTRAP_RESAMPLES:,}",
            "can_promote": can_promote,
            "gate": services.promotion_gate(evaluation, comparison) if can_promote else None,
            "may_override": Role.ADMIN in request_roles(request),
        },
    )


# --- Artifacts -------------------------------------------------------------------------------


def _inside_var_dir(path: Path) -> Path | None:
    """`path` resolved, when it lies inside settings.VAR_DIR; else None."""
    root = Path(settings.VAR_DIR).resolve()
    try:
        resolved = (root / path).resolve()
    except (OSError, RuntimeError):
        return None
    return resolved if resolved.is_relative_to(root) else None


def _artifact_files(job: TrainingJob) -> list[dict[str, Any]]:
    """The job's artifact: the file itself, or the files at the top of its directory."""
    if not job.artifact_path:
        return []
    base = _inside_var_dir(Path(job.artifact_path))
    if base is None:
        return []
    if base.is_file():
        return [{"name": base.name, "size": base.stat().st_size}]
    if base.is_dir():
        files = sorted(p for p in base.iterdir() if p.is_file())[:100]
        return [{"name": p.name, "size": p.stat().st_size} for p in files]
    return []


@require_GET
@role_required(*READERS)
def job_artifact(request: HttpRequest, job_id: int, name: str) -> FileResponse:
    """A file of the job's artifact (the learned policy's weights, an adapter's files), inside VAR_DIR."""
    job = get_object_or_404(TrainingJob, pk=job_id)
    if name not in {f["name"] for f in _artifact_files(job)}:
        raise Http404("no such artifact file")
    base = _inside_var_dir(Path(job.artifact_path))
    assert base is not None  # _artifact_files listed it
    return _send(base if base.is_file() else base / name, name)


def _send(path: Path, name: str) -> FileResponse:
    resolved = _inside_var_dir(path)
    if resolved is None or not resolved.is_file():
        raise Http404("the file is not there")
    return FileResponse(resolved.open("rb"), as_attachment=True, filename=name)


# --- Actions (POST, then redirect) -------------------------------------------------------------


def actor_of(request: HttpRequest) -> Actor:
    return Actor.for_user(request.user)


@require_POST
@role_required(*WRITERS)
def job_start(request: HttpRequest) -> HttpResponse:
    form = JobStartForm(request.POST)
    if form.is_valid():
        try:
            job = services.job_start(
                name=form.cleaned_data["name"],
                backend=form.cleaned_data["backend"],
                dataset=form.cleaned_data.get("dataset"),
                options=form.options(),
                actor=actor_of(request),
                user=request.user,
            )
        except ServiceError as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("training:job", job_id=job.pk)  # its page says it is queued, and what next
    return home_page(request, job_form=form)


@require_POST
@role_required(*WRITERS)
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(TrainingJob, pk=job_id)
    try:
        services.job_cancel(job=job, actor=actor_of(request))
    except ServiceError as exc:
        messages.error(request, f"Not cancelled: {exc}")
    else:
        messages.success(request, f"Cancellation of {job.name} requested.")
    return redirect("training:job", job_id=job.pk)


@require_POST
@role_required(*WRITERS)
def rollouts_start(request: HttpRequest) -> HttpResponse:
    """Start rollouts; with the "Preview" button (name="preview"), the same checks and the estimate of
    what starting would do, on the page again with the form filled in: nothing is started."""
    form = RolloutsForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            items = split_ids(data["item_set"], data["split"], limit=data["limit"], kind=data["domain"])
            asked = {
                "version": data["version"],
                "items": items,
                "k": data["k"],
                "temperature": data["temperature"],
                "item_set": data["item_set"],
                "survey": data["survey"],
                "user": request.user,
            }
            if "preview" in request.POST:
                estimate = services.rollouts_estimate(**asked)
                form = RolloutsForm(request.POST.copy())
                form.data[f"{form.prefix}-shown_usd"] = "" if estimate.usd is None else str(estimate.usd)
                return home_page(request, rollouts_form=form, rollouts_preview=estimate)
            batch = services.rollouts_start(
                **asked, actor=actor_of(request), shown_usd=data["shown_usd"], max_usd=data["max_usd"]
            )
        except ServiceError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Rollout batch {batch.pk} started: {len(items)} items × K={batch.k}.")
            return redirect(reverse("training:home") + "#batches")
    return home_page(request, rollouts_form=form)


@require_POST
@role_required(*WRITERS)
def dataset_build(request: HttpRequest) -> HttpResponse:
    form = DatasetBuildForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            reward_config = RewardConfig.from_dict(
                {
                    "correctness": 1.0 if data["correctness"] is None else data["correctness"],
                    "cost_penalty_per_usd": data["cost_penalty_per_usd"],
                    "format_term": data["format_term"],
                    "human_labels": data["human_labels"],
                }
            )
            dataset = services.dataset_build(
                name=data["name"],
                batch_ids=[b.pk for b in data["batches"]] or None,
                conductor_version=data["conductor_version"],
                since=data["since"],
                until=data["until"],
                items=data["items"],
                min_group_size=data["min_group_size"],
                reward_config=reward_config,
                validation_fraction=data["validation_fraction"],
                actor=actor_of(request),
                user=request.user,
            )
        except ServiceError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Dataset {dataset.name} v{dataset.version} built.")
            return redirect("training:dataset", dataset_id=dataset.pk)
    return home_page(request, dataset_form=form)
