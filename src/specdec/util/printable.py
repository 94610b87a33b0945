"""Text from outside specdec made safe to print: a server's reply or error message, a model
file's names, a results file's fields.

Such text can hold terminal control sequences (``ESC [ 31 m`` turns the terminal red, ``ESC
[ 2 K`` erases a line, so a hostile server's 401 message could paint a fake "certificate
PASS" line) and line breaks (an error that should be one line becomes several). ``printable``
escapes every character that is not printable (control characters, format characters such as
the bidirectional overrides, line and paragraph separators, lone surrogates) the way Python
writes them in a string literal (``\\x1b``, ``\\n``, ``\\u202e``), and can bound the length.
It is the one helper for such text: the CLI's error line goes through it, and so does every
line the commands print that can hold outside text. ``md_text`` and ``md_code`` do the same
for a Markdown file (a certificate, a report): printable, then nothing in the text can start
Markdown or HTML (a server's model id broke out of its backticks into ``<img onerror>``).
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_ERROR_CHARS = 4000  # the CLI's one error line, at most (a safety net; quotes are bounded)


def _escape(ch: str) -> str:
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object, limit: int | None = None) -> str:
    """``str(text)`` with every non-printable character escaped (spaces stay), cut to
    ``limit`` characters (of the escaped text) with a note of how many more there were."""
    s = str(text)
    if not s.isprintable():  # the fast path: isprintable() is True for spaces and letters
        s = "".join(ch if ch == " " or ch.isprintable() else _escape(ch) for ch in s)
    if limit is not None and len(s) > limit:
        s = f"{s[:limit]}... ({len(s) - limit:,} more characters)"
    return s


def quoted_list(items: Iterable[object], *, most: int = 10, limit: int = 80) -> str:
    """``'a', 'b', ... and N more``: at most ``most`` items, each quoted, escaped and cut to
    ``limit`` characters, so a list of 200,000 names from a server stays one short line."""
    shown: list[str] = []
    extra = 0
    for item in items:
        if len(shown) < most:
            shown.append(f"'{printable(item, limit)}'")
        else:
            extra += 1
    return ", ".join(shown) + (f", ... and {extra:,} more" if extra else "")


# -- Markdown (and the HTML a Markdown renderer passes through) ---------------------------------

# ASCII punctuation that can start Markdown or HTML syntax inside a line: emphasis, code, links
# and images, raw HTML and entities, table cells, strikethrough, headings, autolinks
_MD_SPECIAL = frozenset("\\`*_[]<>()!|~#&{}")


def md_text(text: object, limit: int | None = None) -> str:
    """Outside text for a Markdown line: ``printable`` (one line, no control characters),
    then every character that could start Markdown or HTML backslash-escaped (CommonMark
    escapes any ASCII punctuation), so a server's model id or a file's field shows as the
    characters it is: ``<img onerror=...>`` stays text, ``[a](b)`` is no link, ``|`` splits
    no table cell."""
    s = printable(text, limit)
    if any(ch in _MD_SPECIAL for ch in s):
        s = "".join(f"\\{ch}" if ch in _MD_SPECIAL else ch for ch in s)
    return s


def md_code(text: object, limit: int | None = None) -> str:
    """Outside text as a Markdown code span: ``printable``, fenced by one backtick more than
    the longest run of backticks in it (so none closes the span early), with a space inside
    each fence where the text starts or ends with a backtick. Inside a code span, Markdown
    and HTML are literal text."""
    s = printable(text, limit)
    longest = run = 0
    for ch in s:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"
