"""Operating the suite: the ``check`` health command and its HTTP probe, and the schema commands."""
