from django.urls import path

from . import views

urlpatterns = [
    path("views/", views.saved_view_create, name="view-save"),
    path("views/<int:view_id>/", views.saved_view_open, name="view-open"),
]
