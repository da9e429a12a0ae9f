"""Unique jobs at enqueue: the row that holds the key, the queue lock, early duplicates."""
