"""Redis: the key layout, scripts called over each thread's own connection, the set-up check."""
