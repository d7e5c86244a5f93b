"""The site's URLs: each app's pages and API, the schema, login, the admin site."""

from csp.decorators import csp_update
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts.admin import site as admin_site  # the admin site by role (not Django's staff flag)
from observability.views import metrics

from .api_docs import RedocView, redoc_bundle


class FaviconView(RedirectView):
    """Browsers ask for /favicon.ico whatever the page links: send them to the SVG icon."""

    permanent = False

    def get_redirect_url(self, *args, **kwargs) -> str:
        return static("favicon.svg")


handler400 = "conductor_web.error_views.bad_request"
handler404 = "conductor_web.error_views.page_not_found"
handler500 = "conductor_web.error_views.server_error"

urlpatterns = [
    path("favicon.ico", FaviconView.as_view(), name="favicon"),
    path("metrics", metrics, name="metrics"),  # Prometheus: loopback or a token (observability.views)
    path("", include("operations.urls")),
    path("", include("review.annotations.urls")),
    path("", include("review.playground.urls")),
    path("api/training/", include("training.api_urls")),
    path("api/audit/", include("compliance.api_urls")),
    path("api/", include("operations.api_urls")),
    path("api/", include("review.annotations.api_urls")),
    path("audit/", include("compliance.urls")),
    path("training/", include("training.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI's start-up script is served as a file of its own (the split view): no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    # Redoc runs its search in a worker it makes from a blob: allowed on this page only.
    path(
        "api/redoc/",
        csp_update({"worker-src": ["'self'", "blob:"]})(RedocView.as_view(url_name="schema")),
        name="api-redoc",
    ),
    path("api/redoc/redoc.standalone.js", redoc_bundle, name="api-redoc-bundle"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin_site.urls),
]
