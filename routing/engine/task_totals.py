"""A task's row when one of its runs ends: what the run sets on it (its status, answer, score: for the
task's own run) and its totals, the sum of its runs' (so totals never drift from the runs they sum)."""

from __future__ import annotations

import functools
from typing import Any

from django.db.models import Field

from audit import rows

from ..models import Task


def task_ended(task_id: Any, ended: dict[str, Any]) -> None:
    """The task's row when one of its runs ends, in the caller's transaction. The row is locked first,
    in a statement of its own: the sums are then read after any other run's end that held it has
    committed. (An UPDATE that waits for the row reads the runs as they were when it began, and would
    write the task's totals without that run's end.)"""
    with rows.prepared_cursor() as cursor:
        cursor.execute("SELECT 1 FROM routing_task WHERE id = %(task_id)s FOR UPDATE", {"task_id": task_id})
        cursor.execute(task_ended_sql(tuple(ended)), task_ended_params(task_id, ended))


def task_ended_params(task_id: Any, ended: dict[str, Any]) -> dict[str, Any]:
    """The values of `task_ended_sql`'s parameters: the task and what its run's end sets on it."""
    fields = [Task._meta.get_field(name) for name in ended]
    assert all(isinstance(f, Field) for f in fields)
    return {"task_id": task_id, "task_end": rows.document(zip(fields, ended.values(), strict=True))}  # type: ignore[arg-type]


@functools.lru_cache(maxsize=16)
def task_ended_sql(ended: tuple[str, ...], *, with_run_totals: bool = False, gate: str = "") -> str:
    """The UPDATE of the task's row: the fields named in `ended` from the document `task_end`, the
    totals summed over the task's runs. `with_run_totals`: the ending run's own totals are parameters
    (`run_cost_usd`, `run_input_tokens`, `run_output_tokens`, with `run_id`), added to the other runs'
    sums (a statement that sets them on the run too does not see its own change). `gate`: a further
    condition of the statement it is part of."""
    columns = [rows.quoted(Task._meta.get_field(name).column) for name in ended]  # type: ignore[union-attr]
    sets = "".join(f"{column} = r.{column}, " for column in columns)
    sums = "sum(cost_usd), sum(input_tokens), sum(output_tokens)"
    runs = "routing_run WHERE task_id = t.id"
    if with_run_totals:
        sums = ", ".join(
            f"coalesce(sum({c}), 0) + %(run_{c})s" for c in ("cost_usd", "input_tokens", "output_tokens")
        )
        runs += " AND id <> %(run_id)s"
    return (
        f"UPDATE routing_task t SET {sets}(cost_usd, input_tokens, output_tokens) = "  # noqa: S608 - names, not data
        f"(SELECT {sums} FROM {runs}) FROM {rows.populated(Task, 'task_end')} AS r "
        f"WHERE t.id = %(task_id)s{gate}"
    )
