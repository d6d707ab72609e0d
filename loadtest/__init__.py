"""Load tests and the paper's experiments; `loadtest.webtier` is the demo web tier they drive."""

from loadtest.webtier import FEED_LENGTH, SCHEMA_SQL, WebServer, install_schema, schema_statements

__all__ = ["FEED_LENGTH", "SCHEMA_SQL", "WebServer", "install_schema", "schema_statements"]
