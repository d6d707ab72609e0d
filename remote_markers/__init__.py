"""Remote markers: the non-master-region write protocol and its read path (paper section 5).

rm = RemoteMarkers(cache, master=SqlClient(...), local=SqlClient(...), is_master_region=False)
rm.write_with_marker(["user:7"], "UPDATE users SET name=%s WHERE id=%s", ("ann", 7))
user = rm.read_through("user:7", lambda db: db.query_one("SELECT ... WHERE id=7"), ttl=300)
"""

from remote_markers.markers import (
    DEFAULT_MARKER_TTL,
    MARKER_PREFIX,
    RemoteMarkers,
    marker_key,
    mcd_comment,
)
from remote_markers.sql import SqlClient

__all__ = ["DEFAULT_MARKER_TTL", "MARKER_PREFIX", "RemoteMarkers", "SqlClient", "marker_key", "mcd_comment"]
