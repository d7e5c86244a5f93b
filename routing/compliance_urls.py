"""The auditors' pages on tasks: the dossier, legal holds, vendor exposure."""

from django.urls import path

from . import compliance_views as views

app_name = "compliance"

# Under /audit/, beside audit's own pages.
urlpatterns = [
    path("tasks/<uuid:task_id>/", views.dossier, name="dossier"),
    path("tasks/<uuid:task_id>/hold/", views.hold, name="hold"),
    path("vendors/", views.vendor_report, name="vendors"),
]
