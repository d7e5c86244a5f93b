"""The one error type of the services: a request they refuse, with a sentence saying why.

Services of every app raise a subclass (SubmissionError, TrainingError, ...). The REST API answers it
with `{"detail": <the sentence>}` and its `status` (conductor_web.api_errors), so API views never catch
it themselves; pages show the sentence.
"""

from __future__ import annotations


class ServiceError(ValueError):
    """A request a service refuses; the message says why, for the person who asked."""

    status = 400
