"""The enabled workers as of a stamp: a fingerprint of every worker row, read in a statement the
engine makes anyway (a claim's read, a fence, the guard of a one-statement write), so that the workers
are read again only when one changed, however it changed (the admin, the API, SQL)."""

from __future__ import annotations

from audit import rows

from ..models import Worker

WORKERS_STAMP_SQL = (
    f"(SELECT md5(coalesce(string_agg(w::text, ',' ORDER BY w.id), '')) FROM {Worker._meta.db_table} w)"  # noqa: S608 - a name
)
_workers = rows.Stamped(Worker, WORKERS_STAMP_SQL, where="t.enabled", order_by="t.slug")


def workers_as_of(stamp: str | None) -> dict[str, Worker]:
    """The enabled workers by slug, given their stamp read just before: read from the database only
    when it is not the stamp of the workers this process last read (always when None)."""
    return {w.slug: w for w in _workers.as_of(stamp)}
