"""Saved views against the events that record them (registered with the audit verifier beside the
runs' and tasks' checks): each view's name, sharing, filters and query (by its sha256) as its latest
`view.saved` event recorded them (operations.saved_views.services.view_saved_payload), and its owner as the
event's actor. A view inserted by SQL has no event; one renamed, shared or pointed at another query
by SQL differs from it. A full verification's check: a run's proof has no views.
"""

from __future__ import annotations

from collections.abc import Iterator

from audit.actions import Action
from audit.models import GLOBAL_CHAIN, AuditEvent
from audit.verify import Problem, hash_short
from operations.saved_views.services import view_saved_payload
from routing.models import SavedView

HASHES = ("query_sha256",)


def _view_problems(view: SavedView, event: AuditEvent | None) -> Iterator[Problem]:
    named = f"saved view {view.pk} ({view.name!r})"
    if event is None:
        yield Problem("saved_view", None, GLOBAL_CHAIN, None, f"{named}: no view.saved event records it")
        return
    now = view_saved_payload(view)
    for field, value in now.items():
        recorded = event.payload.get(field)
        if recorded != value:
            shown = (hash_short(value), hash_short(recorded)) if field in HASHES else (value, recorded)
            yield Problem(
                "saved_view",
                event.pk,
                event.chain,
                event.seq,
                f"{named}: its {field} is {shown[0]!r} in its row; this view.saved event recorded {shown[1]!r}",
            )
    # An owner deleted leaves the view ownerless (SET_NULL); any other owner is the one who saved it.
    if view.owner_id is not None and str(view.owner_id) != event.actor_id:
        yield Problem(
            "saved_view",
            event.pk,
            event.chain,
            event.seq,
            f"{named}: its owner is user {view.owner_id} in its row; this view.saved event was written"
            f" by {event.actor_name} (user {event.actor_id or 'none'})",
        )


def saved_view_problems(chains: list[str] | None) -> Iterator[Problem]:
    """The registered check: every saved view against its latest view.saved event (full verification only)."""
    if chains is not None:
        return
    latest: dict[str, AuditEvent] = {}
    events = AuditEvent.objects.filter(
        chain=GLOBAL_CHAIN, object_type=SavedView._meta.model_name, action=Action.VIEW_SAVED
    ).order_by("id")
    for event in events.iterator(chunk_size=1000):
        latest[event.object_id] = event
    for view in SavedView.objects.order_by("pk").iterator(chunk_size=1000):
        yield from _view_problems(view, latest.get(str(view.pk)))
