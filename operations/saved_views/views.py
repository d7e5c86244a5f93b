"""Saving a task list's filters under a name, and opening a saved view."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from accounts.roles import EVERYONE, role_required
from utilities.params import InvalidParameter

from .services import list_url, reverse_view, view_save, visible_views


@require_POST
@role_required(*EVERYONE)
def saved_view_create(request: HttpRequest) -> HttpResponse:
    """Save the list's filters under a name; refused (nothing stored), back to the list with the reason:
    the list as it was when only the name was wrong, else the plain list (its query is what was wrong)."""
    query = request.POST.get("query", "")
    try:
        view = view_save(
            user=request.user,
            name=request.POST.get("name", ""),
            query=query,
            shared=request.POST.get("shared") == "on",
        )
    except InvalidParameter as exc:
        messages.error(request, f"Not saved: {exc.detail}")
        return redirect(list_url(query if exc.name == "name" else ""))
    messages.success(request, f"Saved the view {view.name!r}: its address is {reverse_view(view)}.")
    return redirect(list_url(view.query))


@role_required(*EVERYONE)
def saved_view_open(request: HttpRequest, view_id: int) -> HttpResponse:
    view = visible_views(request.user).filter(pk=view_id).first()
    if view is None:
        raise Http404("No such view")
    return redirect(list_url(view.query))
