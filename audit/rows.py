"""Rows as the engine writes and reads them in one statement: a row's values as one JSON document,
unpacked in its statement by `jsonb_populate_record`; rows read with their table's stamp.

A write of many columns is then a statement of few parameters, whose text psycopg parses once and
caches: it parses afresh every statement of more than 50 parameters or 4,096 characters, which cost
the engine's one-statement writes a tenth of their time. The values are what the fields would send
(`get_db_prep_save`), written as PostgreSQL reads them back: times in full ISO 8601 with their
offset, decimals and UUIDs as their text, a JSON field's value as itself.
"""

from __future__ import annotations

import functools
import json
import uuid
import weakref
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, Generic, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.postgresql.base import ServerBindingCursor
from django.db.models import Field, JSONField, Model
from psycopg.adapt import AdaptersMap
from psycopg.types.numeric import Int8Dumper

M = TypeVar("M", bound=Model)


@functools.cache
def quoted(name: str) -> str:
    """A table's or column's name as the database's SQL names it (the backend's quote_name, kept: the
    engine builds its statements' text from names on every write)."""
    return str(connection.ops.quote_name(name))


@functools.cache
def populated(model: type[Model], param: str) -> str:
    """The SQL of one row of `model`'s table, populated from the JSON document in parameter `param`."""
    return f"jsonb_populate_record(NULL::{quoted(model._meta.db_table)}, %({param})s::jsonb)"


def document(values: Iterable[tuple[Field[Any, Any], Any]]) -> str:
    """The JSON document of (field, value) pairs, keyed by column."""
    return _ENCODE(
        {field.column: None if value is None else _writer(field)(value) for field, value in values}
    )


# One encoder for every document (json.dumps makes a new one for each call given any option).
_ENCODE = json.JSONEncoder(allow_nan=False).encode

# Each field's writer, by the field's id (the field kept with it: its id is never another's). A field
# is hashed by its model's names on every look-up of a dict keyed by it; a document is made for every
# row and event the engine writes.
_WRITERS: dict[int, tuple[Field[Any, Any], Any]] = {}


def _writer(field: Field[Any, Any]) -> Any:
    """A function of a value (not None) of `field` to its JSON form: what `_plain` gives, by a shorter
    way for the types the engine writes most (text, integers, times with their offset, decimals, UUIDs,
    foreign keys to them), `_plain` itself for the rest."""
    found = _WRITERS.get(id(field))
    if found is None:
        found = _WRITERS[id(field)] = (field, _made_writer(field))
    return found[1]


def _made_writer(field: Field[Any, Any]) -> Any:
    def plain(value: Any) -> Any:
        return _plain(field, value)

    if isinstance(field, JSONField):
        return lambda value: value
    kind = type(field)
    if kind in (models.ForeignKey, models.OneToOneField):
        # get_db_prep_save of a foreign key is its target's, for every value but "" (then plain's)
        target = _writer(field.target_field)  # type: ignore[attr-defined]
        return lambda value: plain(value) if value == "" else target(value)
    kept = _kept_as(field)
    if kept is not None:
        return lambda value: value if type(value) is kept else plain(value)
    if kind is models.DateTimeField:
        # an aware datetime is sent as it is (a naive one is warned about and made aware: plain)
        return lambda value: (
            value.isoformat() if type(value) is datetime and value.utcoffset() is not None else plain(value)
        )
    if kind is models.DecimalField:
        # a finite Decimal is sent as it is (anything else is converted, or refused: plain)
        return lambda value: str(value) if type(value) is Decimal and value.is_finite() else plain(value)
    if kind is models.UUIDField:
        return lambda value: str(value) if type(value) is uuid.UUID else plain(value)
    return plain


def _plain(field: Field[Any, Any], value: Any) -> Any:
    """The JSON form of what `field` would send for `value` (its get_db_prep_save)."""
    if value is None or type(value) is _kept_as(field):
        return value  # what its field would send unchanged (a str to a text column, ...): as it is
    if isinstance(field, JSONField):
        return value  # stored as the document's own JSON (no encoder: as Django would dump it)
    prepped = field.get_db_prep_save(value, connection)
    if prepped is None or isinstance(prepped, str | int | float):
        return prepped
    if isinstance(prepped, datetime | date | time):
        return prepped.isoformat()
    if isinstance(prepped, Decimal | uuid.UUID):
        return str(prepped)
    raise TypeError(f"{field.model.__name__}.{field.name}: {type(prepped).__name__} has no JSON form here")


def columns(model: type[Model], alias: str) -> str:
    """The SELECT list of every concrete column of `model` on table alias `alias`, in field order
    (what `instance` takes back)."""
    return ", ".join(f"{alias}.{quoted(f.column)}" for f in model._meta.concrete_fields)


def instance(model: type[M], values: Sequence[Any]) -> M:
    """A model instance from its columns as `columns` selected them, each converted as the ORM would
    (a JSON field's text parsed, and so on): rows read by a prepared statement, not a queryset."""
    names, converters = _readers(model)
    converted = list(values)
    for i, col, field_converters in converters:
        for convert in field_converters:
            converted[i] = convert(converted[i], col, connection)
    return model.from_db(connection.alias, names, converted)


@functools.cache
def _readers(model: type[Model]) -> tuple[list[str], list[tuple[int, Any, list[Any]]]]:
    """The attribute names of `model`'s concrete fields, and the ORM's converters of those that have any."""
    fields = model._meta.concrete_fields
    converters = []
    for i, field in enumerate(fields):
        col = field.get_col(model._meta.db_table)
        found = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if found:
            converters.append((i, col, found))
    return [f.attname for f in fields], converters


@functools.cache
def _kept_as(field: Field[Any, Any]) -> type | None:
    """The Python type a field of this class sends as it is (its get_db_prep_save returns a value of
    it unchanged), or None: text, integers and booleans of the plain field classes."""
    kind = type(field)
    if kind in (models.CharField, models.TextField, models.SlugField):
        return str
    if kind in (
        models.AutoField,
        models.BigAutoField,
        models.SmallAutoField,
        models.IntegerField,
        models.BigIntegerField,
        models.SmallIntegerField,
        models.PositiveIntegerField,
        models.PositiveBigIntegerField,
        models.PositiveSmallIntegerField,
    ):
        return int
    if kind is models.BooleanField:
        return bool
    return None


def table_stamp_sql(model: type[Model]) -> str:
    """SQL of the stamp of `model`'s table: its version number, moved by a trigger in the transaction
    of every change to it (audit migration 0011_table_stamps; the table needs its triggers), after the
    versions table's own id (the numbers start again if it is ever made again: a migration rolled back
    and applied anew, under processes that kept rows). Text, as the stamps are compared."""
    return (
        "(SELECT 'audit_tablestamp'::regclass::oid::text || ':' || coalesce((SELECT version "  # noqa: S608 - a name
        f"FROM audit_tablestamp WHERE name = '{model._meta.db_table}'), 0))"
    )


def read_stamped(model: type[M], stamp_sql: str, *, where: str, order_by: str) -> tuple[str, list[M]]:
    """The rows of `model` that `where` selects (on alias `t`), with the stamp (its table's version:
    `stamp_sql`, see table_stamp_sql) read in the same statement, so that the stamp describes exactly the
    rows returned; a cache kept under it is never one of other rows."""
    table = quoted(model._meta.db_table)
    rows = list(
        model._default_manager.raw(
            f"SELECT t.*, s.stamp AS table_stamp FROM (SELECT {stamp_sql} AS stamp) s "  # noqa: S608 - names and constants
            f"LEFT JOIN {table} t ON {where} ORDER BY {order_by}"
        )
    )
    return rows[0].table_stamp, [row for row in rows if row.pk is not None]  # type: ignore[attr-defined]


class Stamped(Generic[M]):
    """Rows kept by this process under their table's stamp, read again only when a caller brings a
    stamp (read in a statement it makes anyway) that is not the one they were read with."""

    def __init__(self, model: type[M], stamp_sql: str, *, where: str, order_by: str) -> None:
        self.model, self.stamp_sql, self.where, self.order_by = model, stamp_sql, where, order_by
        self._kept: tuple[str, list[M]] | None = None

    def as_of(self, stamp: str | None) -> list[M]:
        """The rows, given their stamp read just before (None: read them now). Read, they are kept
        under the stamp read with them: it may be newer than `stamp`, never other rows'."""
        kept = self._kept
        if stamp and kept is not None and kept[0] == stamp:
            return kept[1]
        self._kept = read_stamped(self.model, self.stamp_sql, where=self.where, order_by=self.order_by)
        return self._kept[1]


def prepared_cursor() -> Any:
    """A cursor whose statements are prepared on the server the first time their text is sent, their
    parameters bound there (not quoted into the text): the engine's writes, whose text is the same for
    every write of a kind, are parsed and planned once per connection. Wrapped as Django wraps its own
    cursors (query logging, execute wrappers). Django leaves psycopg's preparing off (for connection
    poolers that cannot keep prepared statements); these statements ask for it each time. Integers go
    as bigint whatever their size (psycopg picks the smallest type, and a statement whose parameter
    types differ is prepared again)."""
    wrapper = connections[DEFAULT_DB_ALIAS]  # this thread's (the proxy `connection` looks it up each time)
    wrapper.close_if_health_check_failed()  # as Django's own cursors: a connection kept since the
    wrapper.ensure_connection()  # last request or task is checked before its first statement
    raw = wrapper.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _ONLY_WHEN_ASKED
    return wrapper._prepare_cursor(_prepared_class()(raw))


_ONLY_WHEN_ASKED = 2**31 - 1  # psycopg prepares a statement after this many runs, or when asked

# Each connection's adapters that send integers as bigint (prepared_cursor), gone with the connection.
_BIGINT_ADAPTERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


@functools.cache
def _prepared_class() -> type:
    class Prepared(ServerBindingCursor):  # type: ignore[misc, valid-type]
        def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(connection, *args, **kwargs)
            # The connection's adapters with integers as bigint: made once per connection, not per cursor.
            adapters = _BIGINT_ADAPTERS.get(connection)
            if adapters is None:
                adapters = _BIGINT_ADAPTERS[connection] = AdaptersMap(connection.adapters)
                adapters.register_dumper(int, Int8Dumper)
            self._adapters = adapters

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            try:
                result = super().execute(query, params, **kwargs)
            except psycopg.errors.FeatureNotSupported as exc:
                if "cached plan" not in str(exc):
                    raise
                # A migration changed a table under a statement this connection prepared (psycopg
                # forgets it): not the caller's fault. Raised as the database failing under it, so a
                # run is left for its next delivery rather than failed.
                raise psycopg.OperationalError(f"a prepared statement went stale: {exc}") from exc
            self._query = _Shown(self.connection, query, params)  # what Django logs (debug, tests)
            return result

    return Prepared


class _Shown:
    """The statement as Django's query log shows it (its parameters quoted in), made only if read."""

    def __init__(self, conn: Any, query: Any, params: Any) -> None:
        self._conn, self._text, self._params = conn, query, params

    @property
    def query(self) -> bytes:
        return psycopg.ClientCursor(self._conn).mogrify(self._text, self._params).encode()
