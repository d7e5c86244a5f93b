"""The enabled workers as of a stamp: a fingerprint of every worker row, read in a statement the
engine makes anyway (a claim's read, a fence, the guard of a one-statement write), so that the workers
are read again only when one changed, however it changed (the admin, the API, SQL)."""

from __future__ import annotations

from audit import rows

from ..models import Worker

WORKERS_STAMP_SQL = (
    f"(SELECT md5(coalesce(string_agg(w::text, ',' ORDER BY w.id), '')) FROM {Worker._meta.db_table} w)"  # noqa: S608 - a name
)
_read: tuple[str, dict[str, Worker]] | None = None


def workers_as_of(stamp: str | None) -> dict[str, Worker]:
    """The enabled workers by slug, given their stamp read just before: read from the database only
    when it is not the stamp of the workers this process last read (always when None). Read, they are
    kept under the stamp read with them, in their statement."""
    global _read
    kept = _read
    if stamp and kept is not None and kept[0] == stamp:
        return kept[1]
    read_stamp, workers = rows.read_stamped(Worker, WORKERS_STAMP_SQL, where="t.enabled", order_by="t.slug")
    _read = (read_stamp, {w.slug: w for w in workers})
    return _read[1]
