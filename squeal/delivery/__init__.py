"""Delivery: a region's committed keys queued per destination and sent as batched deletes, on the reactor.

In data-path order:

    flows    stage 4: one flow per destination, its queue, position and fate
    batcher  stage 5: the flows' deletes in batches over one connection per destination (`Sender`, `SenderHub`)
    tlswrap  TLS for those connections (the standard library's `ssl`, memory BIOs)
    sampler  1-in-N sample of acknowledged deletes, for the monitoring server to re-check
"""
