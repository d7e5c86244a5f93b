"""The test run's entry point into the embedded servers (loaded with `-p`, see pyproject's addopts).

pytest-django imports the settings while pytest starts, before any conftest; this wrapper runs
first, so that with DATABASE_URL or REDIS_URL unset the embedded servers under ./var/ (or
CONDUCTOR_VAR_DIR) are up by then, as manage.py and the ASGI and Celery apps make sure of.
"""

from __future__ import annotations

import pytest

from conductor_web.embedded import start_unless_set


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    start_unless_set()
    return (yield)
