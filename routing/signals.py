"""What routing announces to the apps above it, so that it never imports them.

run_finished: sent once a run's end (succeeded or failed) is written, its chain sealed. Keyword
arguments: `run` (the Run) and `now` (when it ended). A receiver that writes names the kinds of run it
writes for (`writes_at_end`): the end of a run of such a kind is one transaction with the receivers'
writes, which commit or roll back with it (training settles the tasks of its items so). A run of any
other kind that succeeds, as the process last read it, ends in one statement of its own, without
BEGIN and COMMIT around it: the receivers hear of it once that statement committed, and one that
fails then is logged (the run has ended). A failed run's end, and an end that found the run moved
under it, are transactions that the receivers join whatever the run's kind.
"""

from django.dispatch import Signal

run_finished = Signal()

_WRITTEN_AT_END: set[str] = set()


def writes_at_end(*kinds: str) -> None:
    """A receiver of run_finished writes when runs of these kinds end: their ends are transactions
    that its writes join."""
    _WRITTEN_AT_END.update(kinds)


def written_at_end(kind: str) -> bool:
    """Whether a receiver of run_finished writes when a run of this kind ends."""
    return kind in _WRITTEN_AT_END
