"""The event log's cursor (the rules every list pages by are utilities.pagination's)."""

from utilities.pagination import StrictCursorPagination


class EventCursorPagination(StrictCursorPagination):
    """The audit log: newest first, by event number."""

    ordering = "-id"
    page_size = 100
