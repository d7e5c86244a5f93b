"""A task's dossier as a machine-readable bundle that carries its own proof: what the dossier shows
(the task, its runs' decisions, steps and attempts), each run's chain of events, the seal that closed
it and its place in the audit log (its leaf, the audit path to the root of the latest signed tree head
and that tree head's signed note: audit.inclusion), or for a run sealed before the log the signed
checkpoint that covers it. `python -m audit.bundle verify` checks it with the public key alone (no
database, no settings)."""

from __future__ import annotations

from typing import Any

from django.db.models.fields.json import KT
from django.utils import timezone

from audit.actions import Action
from audit.bundle import FORMAT
from audit.chain import event_content, run_chain
from audit.checkpoints import purge_body
from audit.inclusion import latest_tree_head, of_chain
from audit.models import GLOBAL_CHAIN, AuditEvent, ChainPurge, Checkpoint, CheckpointHead
from routing.models import Attempt, Run, Task


def _event(event: AuditEvent) -> dict[str, Any]:
    return {"id": event.pk, "hash": event.hash, "prev_hash": event.prev_hash, "content": event_content(event)}


def _run(run: Run, tree_head: Checkpoint | None) -> dict[str, Any]:
    # Long because a run's entry is one dict of its proofs and values, read in the order a bundle holds them.
    name = run_chain(run.correlation_id)
    seal = (
        AuditEvent.objects.annotate(sealed_chain=KT("payload__chain"))
        .filter(chain=GLOBAL_CHAIN, action=Action.RUN_SEALED, sealed_chain=name)
        .order_by("-seq")
        .first()
    )
    inclusion = of_chain(name, head=tree_head)
    # Before the log: the checkpoint that signed the chain's head (a run in the log needs none).
    head = (
        CheckpointHead.objects.filter(chain=name).select_related("checkpoint").order_by("-seq").first()
        if inclusion is None
        else None
    )
    purge = ChainPurge.objects.filter(chain=name).first()
    return {
        "id": run.pk,
        "chain": name,
        "kind": run.kind,
        "status": run.status,
        "conductor": run.conductor_version.name if run.conductor_version_id else None,
        "final_answer": run.final_answer,
        "score": run.score,
        "stop_reason": run.stop_reason,
        "cost_usd": str(run.cost_usd),
        "decisions": [
            {"id": d.pk, "raw_output": d.raw_output, "plan": d.plan, "alternatives": d.alternatives}
            for d in run.decisions.order_by("pk")
        ],
        "steps": [
            {
                "id": s.pk,
                "decision_id": s.decision_id,
                "index": s.index,
                "depth": s.depth,
                "worker": s.worker_slug,
                "vendor": s.vendor,
                "instruction": s.instruction,
                "messages_sent": s.messages_sent,
                "response": s.response,
                "status": s.status,
            }
            for s in run.steps.order_by("pk")
        ],
        "attempts": [
            {
                "id": a.pk,
                "step_id": a.step_id,
                "number": a.number,
                "status": a.status,
                "http_status": a.http_status,
                "cost_usd": str(a.cost_usd),
                "input_tokens": a.input_tokens,
                "output_tokens": a.output_tokens,
            }
            for a in Attempt.objects.filter(step__run=run).order_by("pk")
        ],
        "events": [_event(e) for e in AuditEvent.objects.filter(chain=name).order_by("seq")],
        "seal": _event(seal) if seal is not None else None,
        "log": inclusion.document() if inclusion is not None else None,
        "checkpoint": (
            {"body": head.checkpoint.body, "signature": head.checkpoint.signature}
            if head is not None
            else None
        ),
        # Deleted under the retention policy: the signed purge stands for the chain it emptied.
        "purge": (
            {
                "body": purge_body(
                    chain_name=purge.chain,
                    last_seq=purge.last_seq,
                    last_hash=purge.last_hash,
                    purged_at=purge.purged_at,
                    reason=purge.reason,
                ),
                "signature": purge.signature,
            }
            if purge is not None
            else None
        ),
    }


def dossier_bundle(task: Task, *, exported_by: str) -> dict[str, Any]:
    tree_head = latest_tree_head()  # every run proven against the same signed tree head
    return {
        "format": FORMAT,
        "exported_at": timezone.now().isoformat(),
        "exported_by": exported_by,
        "task": {
            "id": str(task.pk),
            "text": task.text,
            "classification": task.classification,
            "status": task.status,
            "final_answer": task.final_answer,
            "score": task.score,
            "cost_usd": str(task.cost_usd),
            "purged_at": task.purged_at.isoformat() if task.purged_at else None,
        },
        "runs": [
            _run(run, tree_head) for run in task.runs.select_related("conductor_version").order_by("pk")
        ],
    }
