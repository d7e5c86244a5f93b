"""The playground's page."""

from django.urls import path

from . import playground_views

app_name = "playground"

urlpatterns = [
    path("tasks/<uuid:task_id>/playground/", playground_views.playground_page, name="page"),
]
