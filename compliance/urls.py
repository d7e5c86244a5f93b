"""The auditors' pages under /audit/: the event log and its export, policies, verification, API tokens
(the `audit` namespace), and the pages about tasks: the dossier, legal holds, vendor exposure (the
`compliance` namespace). The two namespaces are the names templates and links already use."""

from django.urls import include, path

from . import dossier_views, views

log_patterns = [
    path("", views.event_log, name="event-log"),
    path("export.<str:fmt>", views.export_events, name="export"),
    path("policies/", views.policy_report, name="policies"),
    path("verify/", views.verify_page, name="verify"),
    path("verify/public-key.pem", views.public_key_download, name="public-key"),
    path("tokens/", views.tokens, name="tokens"),
]

task_patterns = [
    path("tasks/<uuid:task_id>/", dossier_views.dossier, name="dossier"),
    path("tasks/<uuid:task_id>/hold/", dossier_views.hold, name="hold"),
    path("vendors/", dossier_views.vendor_report, name="vendors"),
]

urlpatterns = [
    path("", include((log_patterns, "audit"))),
    path("", include((task_patterns, "compliance"))),
]
