"""Every touch of Dramatiq's broker internals: the Redis broker's key layout, its ids for a
message, publish, ack, local delivery, presence; and the Dramatiq versions they were written
for (compat.py)."""
