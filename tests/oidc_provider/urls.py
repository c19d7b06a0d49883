"""The provider's URLs: django-oauth-toolkit under /o/ (the issuer is http://HOST:PORT/o), the sign-in page."""

from __future__ import annotations

from django.contrib.auth.views import LoginView, LogoutView
from django.http import HttpRequest, HttpResponse
from django.urls import include, path


def home(request: HttpRequest) -> HttpResponse:
    who = request.user.get_username() if request.user.is_authenticated else "nobody"
    return HttpResponse(f"Test OpenID provider: signed in as {who}\n", content_type="text/plain")


urlpatterns = [
    path("", home),
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", LogoutView.as_view(next_page="/accounts/login/"), name="logout"),
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
]
