"""The hash of a JSON value that events record for what they do not carry (messages, responses):
defined once, in the Django-free audit.proof that the standalone bundle verifier reads too."""

from audit.proof import content_hash

__all__ = ["content_hash"]
