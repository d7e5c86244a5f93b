from django.apps import AppConfig


class ReviewConfig(AppConfig):
    """Reviewers' work on runs: annotations and the review queue, and the playground."""

    name = "review"
    verbose_name = "Review"
