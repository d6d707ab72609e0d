"""What a cached value says about the database: `CachedRows`, and the codecs that read a value into them
(`json_rows`, a rule's `codec = "module:function"`)."""

from __future__ import annotations

import importlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors

log = logging.getLogger(__name__)

JSON_FLAG = 64  # the web tier's JsonSerializer client flag (leases/serializer.py)


class VerifyError(Exception):
    """verify could not check anything (one line, for `squealctl verify`'s exit code 2)."""


# -- what a cached value says ------------------------------------------------------------------------


@dataclass(frozen=True)
class CachedRows:
    """What one cached value says the database holds for its key: the rows of the rule's table whose key
    columns equal the key's values, each a dict of (some of) their columns.

    `one`: the value is a single row or "no such row" (compared with the row the key selects).
    `order_by` / `limit`: the value holds only the first `limit` rows in this order (e.g. a feed of the
    latest 20 posts: `order_by="id DESC", limit=20`); without them it holds every matching row, in any order.
    A codec may also return a plain dict (one row), None (no row) or a list of dicts (every matching row).
    """

    rows: tuple[Mapping[str, Any], ...]
    order_by: str | None = None
    limit: int | None = None
    one: bool = False


Codec = Callable[[str, bytes, int], Any]
ORDER_BY = re.compile(r"^\s*[A-Za-z_]\w*(\s+(ASC|DESC))?(\s*,\s*[A-Za-z_]\w*(\s+(ASC|DESC))?)*\s*$", re.I)


def json_rows(family: str, value: bytes, flags: int) -> Any:
    """The default codec: a JSON object is one row, JSON null is "no such row"; anything else (lists, whose
    window and columns only the writer knows) needs the web tier's codec."""
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from e
    if doc is None or isinstance(doc, dict):
        return doc
    raise ValueError(f"a JSON {type(doc).__name__} needs the web tier's codec ([monitoring] verify_codec)")


def load_codec(spec: str) -> Codec:
    """`"package.module:function"` → the function (raises VerifyError naming what is wrong)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise VerifyError(f"codec {spec!r} is not a `package.module:function` import path")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise VerifyError(f"codec {spec!r} cannot be loaded: {e}") from e
    if not callable(found):
        raise VerifyError(f"codec {spec!r} is not callable")
    return found


def resolve_codec(codec: Codec | str | None) -> Codec:
    """A codec given as a callable or an import path; None is `json_rows`."""
    if codec is None:
        return json_rows
    return load_codec(codec) if isinstance(codec, str) else codec


def as_rows(decoded: Any) -> CachedRows:
    if isinstance(decoded, CachedRows):
        found = decoded
    elif decoded is None:
        found = CachedRows((), one=True)
    elif isinstance(decoded, Mapping):
        found = CachedRows((decoded,), one=True)
    elif isinstance(decoded, Sequence) and not isinstance(decoded, str | bytes):
        found = CachedRows(tuple(decoded))
    else:
        raise ValueError(f"codec returned {type(decoded).__name__}, not rows")
    if any(not isinstance(r, Mapping) for r in found.rows):
        raise ValueError("codec returned a row that is not a dict of column values")
    if found.one and len(found.rows) > 1:
        raise ValueError("codec returned several rows for a single-row value")
    if found.order_by is not None and not ORDER_BY.match(found.order_by):
        raise ValueError(f"codec's order_by {found.order_by!r} is not `column [ASC|DESC], ...`")
    if found.limit is not None and (not isinstance(found.limit, int) or found.limit <= 0):
        raise ValueError(f"codec's limit {found.limit!r} is not a positive integer")
    return found


def failure_reason(e: BaseException) -> str:
    if isinstance(e, pymysql.err.Error) and e.args:
        return str(e.args[-1])
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
