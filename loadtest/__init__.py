"""Load tests and the paper's experiments; `loadtest.webtier` is the demo web tier they drive."""

from loadtest.webtier import (
    FEED_LENGTH,
    SCHEMA_SQL,
    ShardClients,
    WebServer,
    install_schema,
    install_schema_on_shards,
    schema_statements,
    shard_master,
)

__all__ = [
    "FEED_LENGTH",
    "SCHEMA_SQL",
    "ShardClients",
    "WebServer",
    "install_schema",
    "install_schema_on_shards",
    "schema_statements",
    "shard_master",
]
