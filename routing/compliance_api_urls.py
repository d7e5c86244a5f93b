"""The auditors' API on tasks, under /api/audit/ beside audit's own endpoints."""

from django.urls import path

from . import compliance_api

app_name = "compliance-api"

urlpatterns = [
    path("vendors/", compliance_api.VendorReportView.as_view(), name="vendors"),
    path("tasks/<uuid:task_id>/dossier/", compliance_api.DossierView.as_view(), name="dossier"),
]
