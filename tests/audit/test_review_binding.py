"""Reviewers' verdicts are bound to their events: one changed, or added, behind the record is named."""

from __future__ import annotations

import pytest

from accounts.models import Role
from audit.checkpoints import checkpoint_create
from audit.verify import verify
from review.annotations import services as review
from tests.audit.support import sql

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_verdict_changed_or_added_behind_the_record_is_named_by_verify(
    finished_run, audit_files, make_user
):
    good = finished_run
    annotation = review.annotation_add(
        verdict=review.Verdict(run_id=good.pk, verdict="wrong", label="arithmetic", comment="41 is not 42"),
        user=make_user("ann", Role.AUDITOR),
    )
    checkpoint_create()
    assert verify().intact

    sql(
        "UPDATE routing_annotation SET verdict = 'correct', comment = 'fine' WHERE id = %(id)s",
        {"id": annotation.pk},
    )
    changed = verify()
    sql(
        "INSERT INTO routing_annotation (run_id, verdict, label, comment, author_name, created_at) "
        "VALUES (%(run)s, 'correct', '', '', 'nobody', now())",
        {"run": good.pk},
    )
    added = verify()

    details = [p.detail for p in changed.problems]
    assert not changed.intact and all(p.kind == "row" for p in changed.problems), details
    assert any(f"annotation {annotation.pk}'s verdict is 'correct'" in d for d in details), details
    assert any(f"annotation {annotation.pk}'s comment (sha256)" in d for d in details), details
    assert any("no annotation.added event records it" in p.detail for p in added.problems), added.problems
