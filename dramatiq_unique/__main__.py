"""``python -m dramatiq_unique COMMAND ...``: the command line (:mod:`dramatiq_unique.cli`)."""

from dramatiq_unique.cli import entry_point

if __name__ == "__main__":
    entry_point()
