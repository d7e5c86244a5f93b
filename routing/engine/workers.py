"""The enabled workers as of a stamp: the workers table's version number (moved by a trigger with every
change to it: audit.rows.table_stamp_sql), read in a statement the engine makes anyway (a claim's read, a fence, the guard of a one-statement write), so that the workers
are read again only when one changed, however it changed (the admin, the API, SQL)."""

from __future__ import annotations

from audit import rows

from ..models import Worker

WORKERS_STAMP_SQL = rows.table_stamp_sql(Worker)
_workers = rows.Stamped(Worker, WORKERS_STAMP_SQL, where="t.enabled", order_by="t.slug")


def workers_as_of(stamp: str | None) -> dict[str, Worker]:
    """The enabled workers by slug, given their stamp read just before: read from the database only
    when it is not the stamp of the workers this process last read (always when None)."""
    return {w.slug: w for w in _workers.as_of(stamp)}
