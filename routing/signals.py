"""What routing announces to the apps above it, so that it never imports them.

run_finished: sent once a run's end (succeeded or failed) is written, its chain sealed. Keyword
arguments: `run` (the Run) and `now` (when it ended). Two ways to hear it, by the run's kind:
- a receiver that writes names the kinds of run it writes for (`writes_at_end`): the end of a run of
  such a kind is one transaction with the receivers' writes, which commit or roll back with it
  (training settles the tasks of its items so);
- for any other kind, the receivers hear once the end committed; one that fails is logged (the run
  has ended).
task_purged: see below.
"""

from django.dispatch import Signal

run_finished = Signal()

# task_purged: sent inside a retention purge's transaction, once the task's content is deleted, so that
# an app above that copied the task's words (training's item sets) deletes its copy in the same commit.
# Keyword arguments: `task`, `now`, `actor`.
task_purged = Signal()

_WRITTEN_AT_END: set[str] = set()


def writes_at_end(*kinds: str) -> None:
    """A receiver of run_finished writes when runs of these kinds end: their ends are transactions
    that its writes join."""
    _WRITTEN_AT_END.update(kinds)


def written_at_end(kind: str) -> bool:
    """Whether a receiver of run_finished writes when a run of this kind ends."""
    return kind in _WRITTEN_AT_END
