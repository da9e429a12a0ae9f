"""The fault suite: real servers of the tests' own failing under load, judged from an event log.

Every test here is marked slow; `pytest -m slow tests/faults` runs them alone.  Each prints a line
``FAULT <scenario> jobs=.. kills=.. reruns=.. recover_s=..`` (visible with ``-n 0 -s``; appended to the
file named by ``DU_FAULT_FIGURES`` too), the figures of the table in docs/discussions/faults.md.
"""
