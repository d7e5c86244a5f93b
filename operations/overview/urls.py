from django.urls import path

from . import views

urlpatterns = [
    path("ops/", views.ops_overview, name="ops"),
]
