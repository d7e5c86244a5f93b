"""The task submission form of the pages, with the limits of routing.limits."""

from django import forms
from django.conf import settings

from routing import limits
from routing.models import DataClass
from routing.scoring.scorers import SCORER_CHOICES


class TaskSubmitForm(forms.Form):
    # The limits are routing.limits' validators, shared with the API and the service, so every path
    # refuses the same values with the same messages.
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}), label="Task")
    reference = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), required=False, label="Reference answer (optional)"
    )
    scorer = forms.ChoiceField(choices=[(s, s) for s in SCORER_CHOICES], initial="auto")
    domain = forms.CharField(
        required=False,
        max_length=limits.DOMAIN_MAX_CHARS,
        label="Kind",
        help_text="Your label for this kind of task (e.g. invoices); the learned conductor routes by it",
    )
    classification = forms.ChoiceField(choices=DataClass.choices, initial=DataClass.INTERNAL)
    max_steps = forms.IntegerField(
        validators=limits.MAX_STEPS_VALIDATORS,
        widget=forms.NumberInput(attrs={"min": 1, "max": limits.MAX_STEPS}),
        initial=settings.CONDUCTOR_DEFAULT_MAX_STEPS,
    )
    max_depth = forms.IntegerField(
        validators=limits.MAX_DEPTH_VALIDATORS,
        widget=forms.NumberInput(attrs={"min": 0, "max": limits.MAX_DEPTH}),
        initial=settings.CONDUCTOR_DEFAULT_MAX_DEPTH,
    )
    max_usd = forms.DecimalField(
        validators=limits.MAX_USD_VALIDATORS,
        decimal_places=limits.USD_DECIMAL_PLACES,
        widget=forms.NumberInput(attrs={"min": 0, "max": limits.MAX_USD}),
        initial=settings.CONDUCTOR_DEFAULT_MAX_USD,
        label="Max USD",
    )
    idempotency_key = forms.CharField(
        required=False,
        validators=limits.IDEMPOTENCY_KEY_VALIDATORS,
        widget=forms.TextInput(attrs={"maxlength": limits.IDEMPOTENCY_KEY_MAX_CHARS}),
    )

    def clean_text(self) -> str:
        text = self.cleaned_data["text"]
        limits.text_length_check(text)
        return text
