"""``web`` on an address other than loopback: refused in the command line's own words, unless basic
auth, read-only or anonymous access is given."""

from __future__ import annotations

from dramatiq_unique.cli import parser


def test_an_open_dashboard_is_refused_in_the_command_line_s_words(run, app, monkeypatch):
    monkeypatch.delenv("DRAMATIQ_UNIQUE_WEB_AUTH", raising=False)
    code, out, err = run(["web", app, "--host", "0.0.0.0", "--port", "0"])
    assert code == 2 and "Traceback" not in err
    assert "DRAMATIQ_UNIQUE_WEB_AUTH=user:password" in err and "--read-only" in err and "--allow-anonymous" in err
    assert "read_only=True" not in err and "allow_anonymous=True" not in err and "basic_auth" not in err
    options = parser().parse_args(["web", "app", "--read-only", "--allow-anonymous"])  # the options it names exist
    assert options.read_only and options.allow_anonymous
    monkeypatch.setenv("DRAMATIQ_UNIQUE_WEB_AUTH", "ops")  # no password: said, not a traceback
    code, _, err = run(["web", app, "--host", "0.0.0.0", "--port", "0"])
    assert code == 2 and "DRAMATIQ_UNIQUE_WEB_AUTH must read user:password" in err
