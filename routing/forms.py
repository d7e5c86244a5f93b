from decimal import Decimal

from django import forms
from django.conf import settings

from training.scorers import SCORER_CHOICES

from .models import DataClass


class TaskSubmitForm(forms.Form):
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}), label="Task")
    reference = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), required=False, label="Reference answer (optional)"
    )
    scorer = forms.ChoiceField(choices=[(s, s) for s in SCORER_CHOICES], initial="auto")
    classification = forms.ChoiceField(choices=DataClass.choices, initial=DataClass.INTERNAL)
    max_steps = forms.IntegerField(min_value=1, max_value=100, initial=settings.CONDUCTOR_DEFAULT_MAX_STEPS)
    max_depth = forms.IntegerField(min_value=0, max_value=5, initial=settings.CONDUCTOR_DEFAULT_MAX_DEPTH)
    max_usd = forms.DecimalField(
        min_value=Decimal("0"),
        max_digits=20,
        decimal_places=10,
        initial=settings.CONDUCTOR_DEFAULT_MAX_USD,
        label="Max USD",
    )
    idempotency_key = forms.CharField(required=False, max_length=200)

    def clean_text(self) -> str:
        text = self.cleaned_data["text"]
        if len(text) > settings.CONDUCTOR_MAX_TASK_CHARS:
            raise forms.ValidationError(f"At most {settings.CONDUCTOR_MAX_TASK_CHARS} characters.")
        return text
