"""The task list, submission, a task, its live graph, a retry."""

from django.urls import path, re_path

from . import views

urlpatterns = [
    path("", views.task_list, name="task-list"),
    path("tasks/new/", views.task_submit_view, name="task-submit"),
    path("tasks/<uuid:task_id>/", views.task_detail, name="task-detail"),
    # The 8-character id the pages show: the task it names, or the list of those it could name.
    re_path(r"^tasks/(?P<short_id>[0-9a-f]{8})/$", views.task_by_short_id, name="task-short"),
    path("tasks/<uuid:task_id>/graph/", views.task_graph, name="task-graph"),
    path("tasks/<uuid:task_id>/retry/", views.task_retry_view, name="task-retry"),
]
