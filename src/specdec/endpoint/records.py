"""The records of a ``specdec bench --endpoint`` results file, read without the HTTP client
(``specdec report`` uses this to tell the file apart from a local bench's)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError
from specdec.textfiles import loads_or_none, require_regular

GroupKey = tuple[str, int, int, int, str]  # (mode, concurrency, repeat, group, side)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete JSON object line of a results file (a partial last line is ignored)."""
    p = Path(path)
    require_regular(p, "results file")  # a FIFO or /dev/zero: an error, not a hang
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"cannot read results file {p}: {e.strerror or e}") from e
    out = []
    for line in text.splitlines():
        rec = loads_or_none(line)  # deeply nested JSON included
        if isinstance(rec, dict):
            out.append(rec)
    return out


def group_key(rec: dict[str, Any]) -> GroupKey:
    return (
        str(rec["mode"]),
        int(rec["concurrency"]),
        int(rec["repeat"]),
        int(rec["group"]),
        str(rec["side"]),
    )


def finished_groups(records: Sequence[dict[str, Any]]) -> set[GroupKey]:
    return {group_key(r) for r in records if r.get("type") == "endpoint_group"}


def is_endpoint_results(path: str | Path) -> bool:
    """True when the file's first record is a ``specdec bench --endpoint`` header."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # not a results file at all: the local reader says so in one line
        with Path(path).open(encoding="utf-8", errors="replace") as f:
            first = f.readline(1 << 20)
    except OSError:
        return False
    return '"type":"endpoint_header"' in first.replace(" ", "")
