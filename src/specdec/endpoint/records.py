"""The records of a ``specdec bench --endpoint`` results file, read without the HTTP client
(``specdec report`` uses this to tell the file apart from a local bench's)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError

GroupKey = tuple[str, int, int, int, str]  # (mode, concurrency, repeat, group, side)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete JSON object line of a results file (a partial last line is ignored)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError as e:
        raise ConfigError(f"results file {p} not found") from e
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
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
        with Path(path).open(encoding="utf-8", errors="replace") as f:
            first = f.readline()
    except OSError:
        return False
    return '"type":"endpoint_header"' in first.replace(" ", "")
