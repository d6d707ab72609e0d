"""From transactions to keys: which memcache keys a committed transaction invalidates, on the read thread.

In data-path order:

    rules     stage 3: each row event -> keys (rule templates over before/after images), /* mcd: */ comment keys
    bulk      changes with no row images (TRUNCATE, DROP, RENAME, statement format): a table's every key
    pipeline  the read loop on one thread: reader -> transactions -> rules -> `Committed`, handed to the reactor
"""
