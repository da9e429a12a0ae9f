"""What the command line prints of anyone's data: no character a terminal acts on reaches it raw."""

from __future__ import annotations

import io
import json
import unicodedata

from dramatiq_unique.cli.commands import cell, pairs, table
from dramatiq_unique.cli.context import Context, visible

#: Sequences an attacker puts in a job's arguments or error: clear the screen, set the window title,
#: write the clipboard (OSC 52), a hyperlink (OSC 8), an 8-bit CSI, overwrite the line, ring the bell,
#: reorder the text (bidi override), a line separator, a lone surrogate (an undecodable byte).
HOSTILE = ("\x1b[2J\x1b[H", "\x1b]0;owned\x07", "\x1b]52;c;ZXZpbA==\x07", "\x1b]8;;http://evil.example\x1b\\link",
           "\x9b31m", "ok\rFAILED", "abc\x08\x08\x08", "\x07", "\u202etxt.exe", "a\u2028b", "\x7f", "\udc80",
           "\U000e0001tag")


def _raw(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (all but newlines)."""
    return [c for c in text if c != "\n" and (unicodedata.category(c)[0] in "CZ" and c != " ")]


def test_visible_writes_out_every_control_character():
    assert visible("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"
    assert visible("\x1b[2J") == "\\x1b[2J" and visible("\x9b") == "\\x9b" and visible("\u202e") == "\\u202e"
    assert visible("a\nb\tc") == "a\\nb\\tc" and visible("a\nb\tc", keep="\n") == "a\nb\\tc"
    for text in HOSTILE:
        assert not _raw(visible(text)), ascii(text)
        escaped = visible(json.dumps(text, ensure_ascii=False), json=True)
        assert not _raw(escaped) and json.loads(escaped) == text, ascii(text)


def test_tables_pairs_and_cells_show_no_raw_control_character():
    for text in HOSTILE:
        assert not _raw(cell(text)) and not _raw(cell([text, 1])), ascii(text)
        assert not _raw(table(("error",), [(text,)])) and not _raw(pairs([("error", text)])), ascii(text)
    lines = table(("id", "error", "n"), [(1, "\x1b[31mred\x1b[0m", 1), (2, "plain", 2)]).splitlines()
    assert len({line.rindex(n) for line, n in zip(lines, "N12", strict=True)}) == 1  # aligned on the escaped text


def test_every_human_readable_output_and_json_goes_through_it():
    for as_json in (False, True):
        out, err = io.StringIO(), io.StringIO()
        ctx = Context(out=out, err=err, json=as_json)
        ctx.emit({"args": list(HOSTILE)}, lambda: "last error:\n" + "\n".join(HOSTILE))
        ctx.say("job: no job " + "".join(HOSTILE))
        assert not _raw(out.getvalue()) and not _raw(err.getvalue())
        if as_json:
            assert json.loads(out.getvalue()) == {"args": list(HOSTILE)}
        else:
            assert out.getvalue().startswith("last error:\n\\x1b[2J")


def test_the_log_lines_of_redrive_and_web_show_no_control_character_raw(monkeypatch):
    import logging

    from dramatiq_unique.cli import commands

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a process that configured no logging
    monkeypatch.setattr(root, "level", root.level)
    commands.log_visibly()
    [handler] = root.handlers
    line = handler.format(logging.LogRecord("x", logging.WARNING, __file__, 1, "job failed: %s", (HOSTILE[0],), None))
    assert not _raw(line) and "\\x1b[2J" in line
    configured = logging.StreamHandler()
    monkeypatch.setattr(root, "handlers", [configured])  # the app's own logging is left as it is
    commands.log_visibly()
    assert root.handlers == [configured]
