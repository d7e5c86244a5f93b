from audit.pagination import StrictCursorPagination


class CreatedCursorPagination(StrictCursorPagination):
    """Tasks (and the API's lists), newest first; ties on created_at are kept apart by the id."""

    ordering = ("-created_at", "-id")
