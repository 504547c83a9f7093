"""Text from the user's files: read with bounds (regular files only, a size cap), made safe to print on one line."""

from __future__ import annotations

import os
import reprlib
import stat

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


LISTED = 8  # names a note lists before "and K more"


def listed(items, n: int = LISTED, limit: int = 40) -> str:
    """Names (keys of a user's file) as they go into one line: each escaped and cut to `limit` characters
    (`printable`), the first `n` of them, then how many more."""
    items = list(items)
    head = ", ".join(printable(str(x), limit) for x in items[:n])
    return head + (f" and {len(items) - n} more" if len(items) > n else "")


class UnreadableFile(ValueError):
    """A user's file that is not a regular UTF-8 file within its size cap; the text says why, without the path."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def read_user_file(path, limit: int, kind: str, give: str) -> str:
    """The UTF-8 text of the regular file at `path` (symlinks followed), at most `limit` bytes; else UnreadableFile.

    The file is opened non-blocking and checked on the open descriptor, so a FIFO (whose read waits for a writer),
    a device (/dev/zero never ends) or a directory is refused before anything is read, also one that took a
    file's place after a stat; a file over `limit` is refused by its size, and one that grows past it while being
    read by the bytes read. `kind` names what the file should be ("a config file"), `give` what to give instead.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL
        raise UnreadableFile(getattr(e, "strerror", None) or str(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(f"not a regular file ({_kind(st.st_mode)}); give {give}")
        too_big = f"larger than {kind} ({limit} bytes at most)"
        if st.st_size > limit:
            raise UnreadableFile(f"{st.st_size} bytes, {too_big}")
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        raw = b"".join(chunks)
    except OSError as e:
        raise UnreadableFile(e.strerror or str(e)) from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise UnreadableFile(f"more than {limit} bytes, {too_big}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFile(f"not UTF-8 text (a binary file?); give {give}") from None
