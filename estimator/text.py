"""Text from the user's files made safe to print on one terminal line."""

from __future__ import annotations

import reprlib

MAX_NAME_SHOWN = 120


def printable(text: str, n: int = MAX_NAME_SHOWN) -> str:
    """`text` as one printable line: control characters (a newline, an ANSI escape from a config.json's
    `_name_or_path`) escaped as Python writes them, cut to `n` characters."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= n else out[: n - 3] + "..."


def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel = 3
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    r.maxstring = r.maxother = r.maxlong = 200
    return r


def shown(value: object, limit: int = 60) -> str:
    """`value` as it goes into an error line: Python's repr with non-ASCII escaped, cut to `limit` characters.

    Containers are written with bounded work (reprlib: three levels, six items each), so a YAML alias bomb
    (a billion nested values from a few lines) is named at once instead of being expanded first."""
    if value is None or isinstance(value, (str, bool, int, float)):
        text = ascii(value)
    else:
        text = _bounded_repr().repr(value).encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def listed(items, n: int = 8, limit: int = 40) -> str:
    """Names (keys of a user's file) as they go into one line: each escaped and cut to `limit` characters
    (`printable`), the first `n` of them, then how many more."""
    items = list(items)
    head = ", ".join(printable(str(x), limit) for x in items[:n])
    return head + (f" and {len(items) - n} more" if len(items) > n else "")
