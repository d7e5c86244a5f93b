"""The query parameters' rules, under the name training's pages import them by: they are
utilities.params'."""

from utilities.params import (  # noqa: F401 (re-exported)
    MAX_TEXT,
    InvalidParameter,
    choice,
    integer,
    moment,
    period,
    text,
    uuid,
)
