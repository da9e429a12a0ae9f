"""Every touch of Dramatiq's broker internals: publish, ack, local delivery, presence."""
