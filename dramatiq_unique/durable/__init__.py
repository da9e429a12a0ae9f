"""Durable jobs: the re-drive, the outbox, rows rebuilt into messages, the scheduler."""
