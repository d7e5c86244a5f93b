"""The reviewers' pages."""

from django.urls import path

from review.annotations import views

app_name = "review"

urlpatterns = [
    path("review/", views.review_queue, name="queue"),
    path("runs/<int:run_id>/annotations/", views.annotate, name="annotate"),
]
