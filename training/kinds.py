"""Task kinds: whatever a deployment labels its tasks with (a task's `domain`, set by the submitter
through the API, the form or a data set), learned from the training items rather than fixed here.

Every kind of the training items is a kind of the policy: it gets its own features, its own scorer and
its own fallback workflow (training.frontier), however few items it has; only a kind the policy never saw
is planned from the text alone. A kind with fewer than MIN_KIND_ITEMS items is too few to trust the
learned choice on: it is planned by its best fixed workflow (the gate in training.frontier). Each kind's
scorer (what "two answers agree" means for it) comes from the items too: the scorer its items were
graded with, else the default one for its label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from routing.scoring.scorers import scorer_name

# The labels policies of formats 1 and 2 were trained on (kept to read those files; nothing new uses it).
LEGACY_KINDS = ["gsm8k", "math-l5", "cruxeval-o"]
# Fewer training items of a kind than this: too few to trust the learned choice on, so the kind is
# planned by its best fixed workflow (training.frontier's gate), never from the text alone.
MIN_KIND_ITEMS = 20
# Scorers that compare two answers symmetrically; an answer is not a regular expression, and asking
# the judge whether two cheap answers agree would cost a call: those kinds agree by exact match.
AGREEMENT_SCORERS = {"numeric", "exact", "literal", "math"}


def kind_of(item: Any) -> str:
    return str(getattr(item, "domain", "") or "").strip()


def kinds_of(items: Iterable[Any], *, min_items: int = 1) -> dict[str, str]:
    """The kinds of the items (those with at least `min_items` items), most frequent first, each with
    its scorer: the one most of its items name (an item's `scorer`, when it has one other than "auto"),
    else the default for the label."""
    counts: Counter[str] = Counter()
    named: dict[str, Counter[str]] = {}
    for item in items:
        kind = kind_of(item)
        if not kind:
            continue
        counts[kind] += 1
        scorer = str(getattr(item, "scorer", "") or "")
        if scorer and scorer != "auto":
            named.setdefault(kind, Counter())[scorer] += 1
    kept = sorted((k for k, n in counts.items() if n >= min_items), key=lambda k: (-counts[k], k))
    return {k: named[k].most_common(1)[0][0] if k in named else scorer_name("auto", k) for k in kept}


def agreement_scorer(scorer: str) -> str:
    return scorer if scorer in AGREEMENT_SCORERS else "exact"
