"""The operators' pages: tasks, a task and its graph, workers, provider calls, the overview, analytics."""

from django.urls import path

from . import views

app_name = "routing"

urlpatterns = [
    path("", views.task_list, name="task-list"),
    path("tasks/new/", views.task_submit_view, name="task-submit"),
    path("tasks/<uuid:task_id>/", views.task_detail, name="task-detail"),
    path("tasks/<uuid:task_id>/graph/", views.task_graph, name="task-graph"),
    path("tasks/<uuid:task_id>/retry/", views.task_retry_view, name="task-retry"),
    path("workers/", views.worker_list, name="worker-list"),
    path("attempts/", views.attempt_list, name="attempt-list"),
    path("ops/", views.ops_overview, name="ops"),
    path("analytics/", views.analytics_page, name="analytics"),
]
