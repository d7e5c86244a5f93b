from django.urls import path

from . import views

urlpatterns = [
    path("runs/compare/", views.run_compare, name="run-compare"),
]
