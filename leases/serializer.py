"""JSON values in memcache.

Why not meta-memcache's default `MixedSerializer`: it pickles anything that is not str/int/bytes, and a
pickle read from a shared cache runs code on load. JSON also never encodes to 0 bytes, so a 0-byte item
is always a lease placeholder (`mg … N`), never a real value — the read path relies on that.
"""

from __future__ import annotations

import json
from typing import Any

from meta_memcache import BaseSerializer, Key
from meta_memcache.base.base_serializer import EncodedValue
from meta_memcache.protocol import Blob

# Client flag for JSON values; distinct from MixedSerializer's bits (0–16) and ZstdSerializer's (32).
JSON_FLAG = 64


class JsonSerializer(BaseSerializer):
    """Values are JSON documents (dicts, lists, str, numbers, None); tuples come back as lists."""

    def serialize(self, key: Key, value: Any) -> EncodedValue:
        data = json.dumps(value, separators=(",", ":"), default=str).encode()
        return EncodedValue(data=data, encoding_id=JSON_FLAG)

    def unserialize(self, data: Blob, encoding_id: int) -> Any:
        if encoding_id != JSON_FLAG:
            # Written by someone else (another serializer): raising makes meta-memcache report a miss.
            raise ValueError(f"not a JSON value (client flag {encoding_id})")
        return json.loads(bytes(data))
