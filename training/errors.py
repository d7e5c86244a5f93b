"""Training's one application error: a request that cannot be carried out, with the reason (the API's
exception handler answers it with a 400, the pages show it beside the form)."""

from routing.errors import ServiceError


class TrainingError(ServiceError):
    """The request cannot be carried out; the message says why."""
