"""Item sets from the command line: upload a file, survey the workers on a split, add logged tasks,
export a version (items and manifest), list the sets."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from routing import engine
from routing.models import Run, RunStatus, Task
from routing.services import conductor_active
from training.errors import TrainingError
from training.itemsets import rows, services
from training.itemsets.selectors import split_ids, version_of
from training.models import ItemSet, Rollout
from training.services import rollouts_start

ACTOR = Actor.service("itemset")


class Command(BaseCommand):
    help = "Item sets: upload, survey, add-tasks, export, list"

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        upload = sub.add_parser(
            "upload", help="add a JSON Lines or CSV file's items to a set (created when new)"
        )
        upload.add_argument("name")
        upload.add_argument("file", type=Path)
        upload.add_argument("--description", default="")
        survey = sub.add_parser("survey", help="every worker answers each item of a split once (rollouts)")
        survey.add_argument("name")
        survey.add_argument("--split", default="train")
        survey.add_argument("--limit", type=int)
        survey.add_argument("--inline", action="store_true", help="run them here instead of on the workers")
        add = sub.add_parser("add-tasks", help="add logged tasks (with a reference or a reviewer's verdict)")
        add.add_argument("name")
        add.add_argument("tasks", nargs="+", help="task ids")
        add.add_argument("--kind", default="")
        export = sub.add_parser("export", help="write a version's items.jsonl and manifest.json")
        export.add_argument("name")
        export.add_argument("--set-version", type=int)
        export.add_argument("--out", type=Path, default=Path("."))
        sub.add_parser("list", help="the sets, their latest versions and hashes")

    def handle(self, *args, **o):
        try:
            getattr(self, "_" + o["action"].replace("-", "_"))(o)
        except TrainingError as exc:
            raise CommandError(str(exc)) from exc

    def _upload(self, o):
        try:
            content = o["file"].read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {o['file']}: {exc}") from exc
        version, added = services.items_upload(
            name=o["name"],
            rows=rows.read_file(content, o["file"].name),
            filename=o["file"].name,
            content_sha256=hashlib.sha256(content).hexdigest(),
            description=o["description"],
            actor=ACTOR,
        )
        self.stdout.write(f"{added} items added to {version}")

    def _survey(self, o):
        ids = split_ids(o["name"], o["split"], limit=o["limit"])
        batch = rollouts_start(
            version=conductor_active(),
            items=ids,
            k=1,
            temperature=1.0,
            actor=ACTOR,
            item_set=o["name"],
            survey=True,
        )
        runs = Rollout.objects.filter(batch=batch).values_list("run_id", flat=True)
        self.stdout.write(
            f"rollout batch {batch.pk}: {len(runs)} runs ({len(ids)} items x {batch.k} workers)"
        )
        if o["inline"]:
            for run_id in runs:
                engine.execute_run(run_id)
            failed = Run.objects.filter(pk__in=list(runs), status=RunStatus.FAILED).count()
            self.stdout.write(f"done: {len(runs) - failed} answered, {failed} failed")

    def _add_tasks(self, o):
        found = Task.objects.in_bulk(o["tasks"])
        missing = [t for t in o["tasks"] if not any(str(k) == t for k in found)]
        if missing:
            raise CommandError(f"no such task: {', '.join(missing)}")
        version, added, _ = services.tasks_add(
            name=o["name"], tasks=list(found.values()), kind=o["kind"], actor=ACTOR
        )
        self.stdout.write(f"{added} tasks added to {version}")

    def _export(self, o):
        version = version_of(o["name"], o["set_version"])
        out: Path = o["out"]
        out.mkdir(parents=True, exist_ok=True)
        items = out / f"{version.item_set.name}-v{version.number}.jsonl"
        with items.open("w", encoding="utf-8", newline="\n") as fh:
            for line in services.version_lines(version):
                fh.write(line + "\n")
        manifest = version.manifest if version.frozen else services.manifest_of(version)
        (out / f"{version.item_set.name}-v{version.number}.manifest.json").write_text(
            json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8"
        )
        services.itemset_exported(version=version, actor=ACTOR, what=f"command line: {items.name}")
        self.stdout.write(f"{items} ({manifest['items']} items, content hash {manifest['content_hash']})")

    def _list(self, o):
        for item_set in ItemSet.objects.order_by("name"):
            version = item_set.versions.order_by("-number").first()
            if version is None:
                continue
            state = f"frozen {version.content_hash[:16]}" if version.frozen else "open"
            self.stdout.write(f"{item_set.name} v{version.number}: {version.items.count()} items, {state}")
