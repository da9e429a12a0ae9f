"""Concurrency slots: at most N holders per group, limits changed at run time."""
