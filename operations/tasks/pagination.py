"""The cursors routing's lists page with (newest first)."""

from utilities.pagination import StrictCursorPagination


class CreatedCursorPagination(StrictCursorPagination):
    """Tasks (and the API's lists), newest first; ties on created_at are kept apart by the id."""

    ordering = ("-created_at", "-id")


class AttemptCursorPagination(StrictCursorPagination):
    """Provider calls, the latest first."""

    ordering = ("-started_at", "-id")
    page_size = 50
