"""Datamarkers: how far each destination has got, kept durably, and what rewinds or resumes from it.

In data-path order:

    datamarkers  stage 6: the `DatamarkerStore` interface and its default, one JSON file per flow
    zkstore      the same interface in ZooKeeper: a pooled region's markers, one znode per (region, shard)
    checkpoints  one shard's marker rounds, replay requests and marker health, on the daemon's once-a-second tick
    replay       `squeal replay` / `squealctl replay`: rewind flows' markers and tell the one running daemon
"""
