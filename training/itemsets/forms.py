"""The item sets' forms: an upload, and logged tasks added (one task, or a saved view's)."""

from __future__ import annotations

from django import forms

from routing.limits import NAME_MAX_CHARS, NAME_RULE, name_check

from .rows import KIND_RULE, MAX_FILE_BYTES


def set_name_field() -> forms.CharField:
    return forms.CharField(
        label="Item set",
        validators=[name_check],
        help_text=f"A new name makes a new set; an existing one adds to it. {NAME_RULE}",
        widget=forms.TextInput(attrs={"maxlength": NAME_MAX_CHARS, "list": "item-set-names"}),
    )


class UploadForm(forms.Form):
    name = set_name_field()
    description = forms.CharField(required=False, max_length=500, help_text="What the items are (a new set)")
    file = forms.FileField(
        help_text=f"JSON Lines or CSV, UTF-8, at most {MAX_FILE_BYTES // (1024 * 1024)} MiB: "
        "id, text, reference, scorer, kind, data_class, split"
    )


class AddTaskForm(forms.Form):
    name = set_name_field()
    task = forms.UUIDField(widget=forms.HiddenInput)
    kind = forms.CharField(
        required=False, max_length=40, help_text=f"Its kind (empty: the task's own). {KIND_RULE}"
    )


class AddViewForm(forms.Form):
    name = set_name_field()
    view = forms.IntegerField(widget=forms.HiddenInput, min_value=1)
    kind = forms.CharField(
        required=False, max_length=40, help_text=f"Their kind (empty: each task's own). {KIND_RULE}"
    )
