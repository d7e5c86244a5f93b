from rest_framework.pagination import CursorPagination

from audit import params


class CreatedCursorPagination(CursorPagination):
    """Keyset pagination: stable and fast however deep the page, unlike OFFSET."""

    ordering = ("-created_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        # A page size that cannot be honoured is refused (400), not silently replaced by the default.
        return params.integer(
            request.query_params,
            self.page_size_query_param,
            default=self.page_size,
            minimum=1,
            maximum=self.max_page_size,
        )
