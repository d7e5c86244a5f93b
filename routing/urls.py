"""The operators' pages: tasks, a task and its graph, runs side by side, workers, provider calls, the overview, analytics."""

from django.urls import path, re_path

from . import compare_views, saved_views, views

app_name = "routing"

urlpatterns = [
    path("", views.task_list, name="task-list"),
    path("views/", saved_views.saved_view_create, name="view-save"),
    path("views/<int:view_id>/", saved_views.saved_view_open, name="view-open"),
    path("tasks/new/", views.task_submit_view, name="task-submit"),
    path("tasks/<uuid:task_id>/", views.task_detail, name="task-detail"),
    # The 8-character id the pages show: the task it names, or the list of those it could name.
    re_path(r"^tasks/(?P<short_id>[0-9a-f]{8})/$", views.task_by_short_id, name="task-short"),
    path("tasks/<uuid:task_id>/graph/", views.task_graph, name="task-graph"),
    path("tasks/<uuid:task_id>/retry/", views.task_retry_view, name="task-retry"),
    path("runs/compare/", compare_views.run_compare, name="run-compare"),
    path("workers/", views.worker_list, name="worker-list"),
    path("attempts/", views.attempt_list, name="attempt-list"),
    path("ops/", views.ops_overview, name="ops"),
    path("analytics/", views.analytics_page, name="analytics"),
]
