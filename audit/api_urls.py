"""The auditors' API (/api/audit/): events, their export, the policy report, verification."""

from django.urls import path

from . import api

app_name = "audit-api"

urlpatterns = [
    path("events/", api.EventViewSet.as_view({"get": "list"}), name="event-list"),
    path("export.jsonl", api.EventExportView.as_view(), name="export-jsonl"),
    path("export.csv", api.EventExportCsvView.as_view(), name="export-csv"),
    path("policies/", api.PolicyReportView.as_view(), name="policies"),
    path("verify/", api.VerifyView.as_view(), name="verify"),
]
