from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("", include("routing.urls")),
    path("api/training/", include("training.api_urls")),
    path("api/", include("routing.api_urls")),
    path("audit/", include("audit.urls")),
    path("training/", include("training.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
