"""Jobs that wait for a gate (an execution lock, a slot) without holding a worker thread."""
