"""The app name a suite writes into its job rows (dramatiq_unique.suite.app_name)."""

from __future__ import annotations

from dramatiq_unique.suite import MAX_APP_LENGTH, app_name


def test_the_app_is_the_key_prefix():
    assert app_name("billing") == "billing"
    assert app_name("x" * MAX_APP_LENGTH) == "x" * MAX_APP_LENGTH


def test_a_too_long_prefix_is_shortened_stably_and_distinctly():
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    assert len(app_name(long_a)) == MAX_APP_LENGTH
    assert app_name(long_a) == app_name(long_a) != app_name(long_b)
