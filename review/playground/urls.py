"""The playground's page."""

from django.urls import path

from review.playground import views

app_name = "playground"

urlpatterns = [
    path("tasks/<uuid:task_id>/playground/", views.playground_page, name="page"),
]
