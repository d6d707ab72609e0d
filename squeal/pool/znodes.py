"""The pool's znodes hold JSON objects (the package docstring lists them); this reads one, on the caller's thread.

A znode an older or a broken writer left unreadable reads as `{}`: every reader takes each field with a default, so
one bad document degrades to "unknown", never to a worker or a controller that stops."""

from __future__ import annotations

import json
from typing import Any


def read_doc(data: bytes) -> dict[str, Any]:
    """A znode's JSON object; `{}` for empty data, bad JSON, or JSON that is not an object."""
    try:
        doc = json.loads(data.decode() or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
