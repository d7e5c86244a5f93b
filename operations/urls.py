"""The operators' pages, one feature a package: tasks, saved views, runs side by side, the pool, the
overview, analytics. Their URL names keep the `routing:` namespace they were made under."""

from django.urls import include, path

app_name = "routing"

urlpatterns = [
    path("", include("operations.tasks.urls")),
    path("", include("operations.saved_views.urls")),
    path("", include("operations.compare.urls")),
    path("", include("operations.pool.urls")),
    path("", include("operations.overview.urls")),
    path("", include("operations.analytics.urls")),
]
