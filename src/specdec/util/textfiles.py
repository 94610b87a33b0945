"""Files a user names (prompts, chat messages, results): read with a size bound, decoded as
UTF-8, parsed as JSON without recursion errors; every failure one ConfigError line.

``--messages /dev/zero`` or ``--prompts /dev/zero`` used to read forever, and a JSON file of
100,000 nested brackets raised RecursionError; here a file is read up to its limit and no
further, and JSON nested deeper than ``jsonbound.MAX_DEPTH`` is a user error. A FIFO given as
a file (``--api-key-file``, a resume file, ``--prompts``) blocked forever in ``open`` waiting
for a writer: every file a user names goes through ``open_regular``, which refuses a FIFO, a
device or a directory before it reads a byte (the name is checked, then opened without
blocking and checked again, so a FIFO swapped in between cannot block either). Standard input
is named ``-``.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO

from specdec.errors import ConfigError
from specdec.util import jsonbound

MAX_TEXT_BYTES = 64 << 20  # a prompts or messages file; far more than any context window


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / (1 << 10):g} KiB"


def kind_of(mode: int) -> str:
    """What a file of ``stat`` mode ``mode`` is, in words ("a FIFO (named pipe)", ...)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "neither a file nor a directory"


def _not_regular(what: str, path: str | os.PathLike[str], mode: int) -> ConfigError:
    return ConfigError(f"{what} {path} is not a regular file: it is {kind_of(mode)}")


def open_regular(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file (a link to one counts); a FIFO,
    a device, a socket or a directory is a ConfigError raised before a byte is read, and
    never a wait for a writer (see the module docstring)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as e:
        raise ConfigError(f"cannot read {what} {path}: not found") from e
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from e
    if stat.S_ISDIR(mode):
        raise ConfigError(f"cannot read {what} {path}: it is a directory")
    if not stat.S_ISREG(mode):
        raise _not_regular(what, path, mode)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped for something else since the check above
            raise _not_regular(what, path, mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of ``path`` ("-": standard input), at most ``limit`` of them (a longer file
    or an endless standard input is a ConfigError once the limit is passed; a FIFO, a device
    or a directory is one before anything is read)."""
    p = Path(path)
    if str(path) == "-":
        if sys.stdin is None or sys.stdin.closed:
            raise ConfigError(f"{what} is '-' but standard input is closed")
        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:
            raise ConfigError(f"{what} on standard input is larger than {_mib(limit)}")
        return data
    try:
        with open_regular(p, what) as f:
            data = f.read(limit + 1)
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
        raise _not_regular(what, path, mode)


def parse_json(text: str, where: str) -> Any:
    """``json.loads`` with its failures as one ConfigError line: invalid JSON, and JSON
    nested deeper than ``jsonbound.MAX_DEPTH``."""
    try:
        return jsonbound.loads(text)
    except jsonbound.JsonError as e:
        raise ConfigError(f"{where}: {e}") from e


def loads_or_none(text: str | bytes) -> Any:
    """``json.loads``, or None for text that is not JSON or nested too deeply (records read
    back tolerantly)."""
    return jsonbound.loads_or_none(text)
