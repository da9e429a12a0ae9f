"""Every touch of Dramatiq's broker internals: the Redis broker's key layout and the versions it
was checked against, its ids for a message, batch publishes, local delivery, presence."""
