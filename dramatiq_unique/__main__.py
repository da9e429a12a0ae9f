"""``python -m dramatiq_unique COMMAND ...``: the command line (:mod:`dramatiq_unique.cli`)."""

import sys

from dramatiq_unique.cli import main

if __name__ == "__main__":
    sys.exit(main())
