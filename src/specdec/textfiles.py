"""Files a user names (prompts, chat messages, results): read with a size bound, decoded as
UTF-8, parsed as JSON without recursion errors; every failure one ConfigError line.

``--messages /dev/zero`` or ``--prompts /dev/zero`` used to read forever, and a JSON file of
100,000 nested brackets raised RecursionError; here a file (or device, or pipe) is read up to
its limit and no further, and JSON nested deeper than Python can parse is a user error.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError

MAX_TEXT_BYTES = 64 << 20  # a prompts or messages file; far more than any context window


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def read_bytes(path: str | os.PathLike[str], what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of ``path`` ("-": standard input), at most ``limit`` of them (a longer file,
    a device such as /dev/zero, or an endless pipe is a ConfigError once the limit is
    passed)."""
    p = Path(path)
    if str(path) == "-":
        if sys.stdin is None or sys.stdin.closed:
            raise ConfigError(f"{what} is '-' but standard input is closed")
        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:
            raise ConfigError(f"{what} on standard input is larger than {_mib(limit)}")
        return data
    try:
        with p.open("rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError as e:
        raise ConfigError(f"cannot read {what} {p}: not found") from e
    except IsADirectoryError as e:
        raise ConfigError(f"cannot read {what} {p}: it is a directory") from e
    except OSError as e:
        raise ConfigError(f"cannot read {what} {p}: {e.strerror or e}") from e
    if len(data) > limit:
        raise ConfigError(f"{what} {p} is larger than {_mib(limit)}")
    return data


def read_text(path: str | os.PathLike[str], what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """``read_bytes`` decoded as UTF-8 (bytes that are not UTF-8: a ConfigError naming the
    byte)."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        where = "on standard input" if str(path) == "-" else str(path)
        raise ConfigError(f"{what} {where} is not valid UTF-8 at byte {e.start}") from e


def require_regular(path: str | os.PathLike[str], what: str) -> None:
    """A ConfigError unless ``path`` is a regular file (not a device, FIFO or directory):
    for files that specdec itself writes and reads back whole."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as e:
        raise ConfigError(f"{what} {path} not found") from e
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from e
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} {path} is not a regular file")


def parse_json(text: str, where: str) -> Any:
    """``json.loads`` with its failures as one ConfigError line: invalid JSON, and JSON
    nested too deeply to parse (RecursionError)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from e
    except RecursionError as e:
        raise ConfigError(f"{where}: JSON nested too deeply") from e


def loads_or_none(text: str | bytes) -> Any:
    """``json.loads``, or None for text that is not JSON (records read back tolerantly)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
