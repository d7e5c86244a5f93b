"""The auditors' API under /api/audit/: events, their export, the policy report, verification (the
`audit-api` namespace), and on tasks: vendor exposure, a task's dossier (the `compliance-api`
namespace)."""

from django.urls import include, path

from . import api, dossier_api

log_patterns = [
    path("events/", api.EventViewSet.as_view({"get": "list"}), name="event-list"),
    path("export.jsonl", api.EventExportView.as_view(), name="export-jsonl"),
    path("export.csv", api.EventExportCsvView.as_view(), name="export-csv"),
    path("policies/", api.PolicyReportView.as_view(), name="policies"),
    path("verify/", api.VerifyView.as_view(), name="verify"),
    path("public-key/", api.PublicKeyView.as_view(), name="public-key"),
    path("log/checkpoint/", api.LogCheckpointView.as_view(), name="log-checkpoint"),
    path("log/consistency/", api.LogConsistencyView.as_view(), name="log-consistency"),
]

task_patterns = [
    path("vendors/", dossier_api.VendorReportView.as_view(), name="vendors"),
    path("tasks/<uuid:task_id>/dossier/", dossier_api.DossierView.as_view(), name="dossier"),
    path("tasks/<uuid:task_id>/log/", dossier_api.LogInclusionView.as_view(), name="log-inclusion"),
]

urlpatterns = [
    path("", include((log_patterns, "audit-api"))),
    path("", include((task_patterns, "compliance-api"))),
]
