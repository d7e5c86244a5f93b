"""The reviewers' pages."""

from django.urls import path

from . import review_views

app_name = "review"

urlpatterns = [
    path("review/", review_views.review_queue, name="queue"),
    path("runs/<int:run_id>/annotations/", review_views.annotate, name="annotate"),
]
