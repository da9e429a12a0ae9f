"""Redis locks: the Redlock algorithm over bounded masters."""
