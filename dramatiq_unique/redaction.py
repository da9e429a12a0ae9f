"""Passwords out of messages: :func:`redact` writes ``***`` for a URL's password, a ``password=`` (and the
like) pair, and such a key in a dict's repr: a safety net for text the suite did not build itself."""

from __future__ import annotations

import re

#: Written instead of a password.
HIDDEN = "***"

#: Keys whose value is a secret: libpq's ``password`` and ``sslpassword``, and any key ending so
#: (``DB_PASSWORD``, ``client_secret``, ``auth_token``).
_KEYS = r"(?:\w*(?:password|passwd|pwd|passphrase|secret)|\w*(?:auth|access|api|bearer)_?token|\w*api_?key)"
#: A value: quoted (with backslash escapes, as libpq reads them; a bytes repr too), or bare.
_VALUE = r"""b?'(?:[^'\\]|\\.)*'?|b?"(?:[^"\\]|\\.)*"?|[^\s&;,'"<>)}\]]*"""

#: scheme://user:password@ (the user info ends at the last "@" before a space or a quote: a password
#: may hold an unencoded "@" or "/").
_USERINFO = re.compile(r"""(?i)\b([a-z][a-z0-9+.\-]*://)([^\s'"<>@:/]*):([^\s'"<>]*)@""")
#: password=value, as libpq and URL queries write it.
_KEY_VALUE = re.compile(rf"(?i)(?<![\w.\-])({_KEYS})(\s*=\s*)({_VALUE})")
#: 'password': 'value' (a dict's repr, JSON).
_DICT_ITEM = re.compile(rf"""(?i)(['"]{_KEYS}['"]\s*:\s*)({_VALUE})""")


def redact(text: str) -> str:
    """``text`` with every password it holds written as ``***`` (see the module docstring)."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{HIDDEN}@", text)
    text = _KEY_VALUE.sub(lambda m: m.group(1) + m.group(2) + _hidden(m.group(3)) if m.group(3) else m.group(0), text)
    return _DICT_ITEM.sub(lambda m: m.group(1) + _hidden(m.group(2)) if m.group(2) else m.group(0), text)


def _hidden(value: str) -> str:
    """``***`` in the value's own quotes (so that JSON stays JSON)."""
    quote = value.lstrip("b")[:1]
    return f"{quote}{HIDDEN}{quote}" if quote in ("'", '"') else HIDDEN
