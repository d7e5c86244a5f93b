"""Redoc, served whole from the app: its bundle (drf-spectacular's sidecar) with the one address of
another host it holds, its maker's logo in the menu's footer, taken out. Redoc draws that logo
unconditionally; the Content-Security-Policy (img-src 'self') refuses it, a console error on every
visit. Without an address the image is not requested and Redoc hides it (its own error handler)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from django.contrib.staticfiles import finders
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from drf_spectacular.views import SpectacularRedocView

REDOC_BUNDLE = "drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js"
MAKERS_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@lru_cache(maxsize=1)
def redoc_bundle_text() -> str:
    found = finders.find(REDOC_BUNDLE)
    if not found:
        raise FileNotFoundError(f"{REDOC_BUNDLE} is not among the static files")
    return Path(str(found)).read_text(encoding="utf-8").replace(MAKERS_LOGO, "")


def redoc_bundle(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(redoc_bundle_text(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=86400"
    return response


class RedocView(SpectacularRedocView):
    @staticmethod
    def _redoc_standalone() -> str:
        return reverse("api-redoc-bundle")
