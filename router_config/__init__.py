"""The topology model: one TOML file describes regions, databases, clusters, pools and invalidation rules.

Every other package reads topology through this API (never by parsing the file itself).
"""

from router_config.emitter import EMITTED_HANDLES, all_cluster_configs, cluster_config, handle_types, render
from router_config.loader import TopologyError, load, loads
from router_config.model import (
    TLS_COMPONENTS,
    Address,
    CertKey,
    Cluster,
    ColdStart,
    Database,
    MonitoringSettings,
    Pool,
    PoolPlacement,
    Region,
    RegionalPool,
    Rule,
    SquealEndpoint,
    SquealInstance,
    SquealSettings,
    TlsSettings,
    Topology,
    ZooKeeperSettings,
)
from router_config.rewrite import can_listen, dumps, reassign_ports, to_document, with_cold_cluster
from router_config.tls import (
    cert_expiry_timestamp,
    certificate_files,
    client_context,
    mysql_options,
    server_certificate,
    tls_context,
    verifying_context,
)

__all__ = [
    "EMITTED_HANDLES",
    "TLS_COMPONENTS",
    "Address",
    "CertKey",
    "Cluster",
    "ColdStart",
    "Database",
    "MonitoringSettings",
    "Pool",
    "PoolPlacement",
    "Region",
    "RegionalPool",
    "Rule",
    "SquealEndpoint",
    "SquealInstance",
    "SquealSettings",
    "TlsSettings",
    "Topology",
    "TopologyError",
    "all_cluster_configs",
    "can_listen",
    "cert_expiry_timestamp",
    "certificate_files",
    "client_context",
    "cluster_config",
    "dumps",
    "handle_types",
    "load",
    "loads",
    "mysql_options",
    "reassign_ports",
    "render",
    "server_certificate",
    "tls_context",
    "to_document",
    "verifying_context",
    "with_cold_cluster",
    "ZooKeeperSettings",
]
