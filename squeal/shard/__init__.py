"""A shard's pipeline as a running service, and a region's shards composed around shared senders.

In data-path order:

    copies     which copy of a shard a pipeline reads (the topology's copies in `placement.read_order`)
    daemon     `Daemon`: one shard's pipeline wired together (reader -> keys -> flows -> senders -> markers)
    data_loss  what a shard's readers do when the binlog cannot serve a position (halt, or flush and resume)
    region     `RegionDaemon`: one `Daemon` per shard of a region, sharing one `Sender` per destination
"""
