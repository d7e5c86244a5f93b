"""ML staff's clients, shared by the training tests that act as one person through the page and the API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Role
from tests.conftest import clear_queues


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def mira(make_user):
    return make_user("mira", Role.ML_STAFF)


@pytest.fixture
def page(mira) -> Client:
    client = Client()
    client.force_login(mira)
    return client


@pytest.fixture
def api(mira) -> APIClient:
    client = APIClient()
    client.force_authenticate(mira)
    return client


@pytest.fixture
def broker(settings) -> Iterator[redis.Redis]:
    """The real Redis broker, its queues emptied before and after: no worker takes the messages here."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    clear_queues()
    yield client
    clear_queues()
    client.close()
