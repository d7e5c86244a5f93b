from django.urls import path

from . import views

urlpatterns = [
    path("workers/", views.worker_list, name="worker-list"),
    path("attempts/", views.attempt_list, name="attempt-list"),
]
