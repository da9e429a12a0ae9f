"""The log lines the suite silences (dramatiq_unique.logs): each filter drops its line and no other; no services."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from dramatiq_unique.logs import PARKED, ParkedSkipFilter, QuietTicks, ResultWarningFilter


def record(msg: str, *args, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("x", level, __file__, 1, msg, args, None)


def test_a_parked_message_is_not_reported_as_skipped():
    parked, other = SimpleNamespace(**{PARKED: True}), SimpleNamespace()
    keep = ParkedSkipFilter().filter
    assert not keep(record("Message %s was skipped.", parked))
    assert keep(record("Message %s was skipped.", other))
    assert keep(record("Failed to process message %s with unhandled exception.", parked))


def test_a_tracked_actors_result_is_not_reported_as_discarded(monkeypatch):
    monkeypatch.setattr(ResultWarningFilter, "suites", [SimpleNamespace(actors={"tracked": None})])
    keep = ResultWarningFilter().filter
    line = "Actor '%s' returned a value that is not None, but you haven't set its `store_results' option."
    assert not keep(record(line, "tracked"))
    assert keep(record(line, "plain"))
    assert keep(record("Actor '%s' failed.", "tracked"))


def test_only_the_redrive_ticks_info_lines_are_dropped():
    keep = QuietTicks().filter
    assert not keep(record('Running job "dramatiq_unique re-drive (trigger: interval)"', level=logging.INFO))
    assert keep(record('Running job "nightly report (trigger: cron)"', level=logging.INFO))
    assert keep(record('Job "dramatiq_unique re-drive" raised an exception', level=logging.ERROR))


def test_a_filter_is_installed_once():
    logger = logging.getLogger("apscheduler.executors.default")
    QuietTicks.install()
    QuietTicks.install()
    assert sum(isinstance(f, QuietTicks) for f in logger.filters) == 1


def test_a_password_in_a_suite_log_line_is_written_as_stars(caplog):
    from dramatiq_unique.logs import RedactPasswords
    from dramatiq_unique.storage import stores  # a module of the suite that logs

    RedactPasswords.install()
    logger = logging.getLogger(stores.__name__)
    assert any(isinstance(f, RedactPasswords) for f in logger.filters)
    with caplog.at_level(logging.INFO, logger=stores.__name__):
        logger.warning("Job %s does not answer (%s)", "store 1", 'database "host=db password=s3cr3t-pw" is missing')
        try:
            raise RuntimeError("could not connect to postgresql://app:s3cr3t-pw@db/jobs")
        except RuntimeError:
            logger.exception("The health check failed.")
        logger.info("Job %s answers again.", "store 1")
    assert "s3cr3t-pw" not in caplog.text and "password=***" in caplog.text and "app:***@db" in caplog.text
    assert "Job store 1 answers again." in caplog.text
