"""The audit pages: the event log and its export, policies, verification, API tokens."""

from django.urls import path

from . import views

app_name = "audit"

urlpatterns = [
    path("", views.event_log, name="event-log"),
    path("export.<str:fmt>", views.export_events, name="export"),
    path("policies/", views.policy_report, name="policies"),
    path("verify/", views.verify_page, name="verify"),
    path("tokens/", views.tokens, name="tokens"),
]
