"""The event log's filter: which events a page, the API or an export shows (the rules it reads values
with are utilities.filters')."""

from __future__ import annotations

from django.db.models import Q

from utilities import params
from utilities.filters import RuleFilter, StrictFilterSet, moment

from .models import AuditEvent


class AuditEventFilter(StrictFilterSet):
    action = RuleFilter(params.text, lookup_expr="startswith")
    actor = RuleFilter(params.text, field_name="actor_name")
    task = RuleFilter(params.uuid, field_name="task_id")
    object_type = RuleFilter(params.text)
    chain = RuleFilter(params.text)
    q = RuleFilter(params.text, method="search")
    since = moment(field_name="occurred_at", lookup_expr="gte")
    until = moment(end=True, field_name="occurred_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields: list[str] = []

    def search(self, queryset, name, value: str):

        return queryset.filter(
            Q(object_id=value) | Q(actor_name__icontains=value) | Q(action__icontains=value)
        )

    def applied(self) -> dict[str, str]:
        """The query parameters that select this filter (what the pages and exports read back)."""
        self.is_valid()
        return {
            name: value.isoformat() if hasattr(value, "isoformat") else str(value)
            for name, value in self.form.cleaned_data.items()
            if value not in (None, "")
        }
