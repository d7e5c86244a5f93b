"""What routing announces to the apps above it, so that it never imports them.

run_finished: sent inside the transaction that ends a run (succeeded or failed), after its chain is
sealed. Keyword arguments: `run` (the Run) and `now` (when it ended). A receiver's writes commit or
roll back with the run's end; training settles the tasks of its items with it.
"""

from django.dispatch import Signal

run_finished = Signal()
