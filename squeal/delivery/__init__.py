"""Delivery: a region's committed keys queued per destination and sent as batched deletes, on squeal_native's
delivery thread (`[squeal] delivery = "native"`, the default) or on the reactor (`"python"`, the reference).

In data-path order:

    flows    stage 4: one flow per destination, its queue, position and fate
    batcher  stage 5: the flows' deletes in batches over one connection per destination (`Sender`, `SenderHub`)
    tlswrap  TLS for those connections (the standard library's `ssl`, memory BIOs)
    sampler  1-in-N sample of acknowledged deletes, for the monitoring server to re-check
    native   the same stages on the delivery thread, behind the faces above (`NativeHub`, `NativeFlow`); `make_hub`
"""
