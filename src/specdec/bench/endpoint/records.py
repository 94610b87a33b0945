"""The records of a ``specdec bench --endpoint`` results file, read without the HTTP client
(``specdec report`` uses this to tell the file apart from a local bench's)."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.util.textfiles import loads_or_none, read_bytes

GroupKey = tuple[str, int, int, int, str]  # (mode, concurrency, repeat, group, side)


MAX_RESULTS_BYTES = 1 << 30  # a results file (a long sweep writes a few MB)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every readable record of a results file: complete JSON object lines (a partial last
    line is ignored, JSON nested too deeply is unreadable) whose fields the report and
    ``--resume`` use have their types (``record_ok``); other lines are left out."""
    p = Path(path)
    data = read_bytes(p, "results file", MAX_RESULTS_BYTES)  # a FIFO: an error, not a hang
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        rec = loads_or_none(line)
        if isinstance(rec, dict) and record_ok(rec):
            out.append(rec)
    return out


def _int(x: Any, low: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x < 1 << 53


def _num(x: Any, *, optional: bool = False) -> bool:
    if x is None:
        return optional
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _key_ok(rec: dict[str, Any]) -> bool:
    return (
        isinstance(rec.get("mode"), str)
        and _int(rec.get("concurrency"), 1)
        and _int(rec.get("repeat"))
        and _int(rec.get("group"))
        and rec.get("side") in ("on", "off")
    )


def record_ok(rec: dict[str, Any]) -> bool:
    """Whether an ``endpoint_request`` or ``endpoint_group`` record has the types the report
    and ``--resume`` read (other records pass: their readers use ``.get`` with checks)."""
    kind = rec.get("type")
    if kind == "endpoint_request":
        counts = (rec.get("drafted"), rec.get("accepted"))
        return (
            _key_ok(rec)
            and _int(rec.get("slot"))
            and _num(rec.get("e2e_s"))
            and _num(rec.get("ttft_s"), optional=True)
            and _num(rec.get("decode_tps"), optional=True)
            and all(c is None or _int(c) for c in counts)
        )
    if kind == "endpoint_group":
        counts = (rec.get("metrics_drafted"), rec.get("metrics_accepted"))
        return (
            _key_ok(rec)
            and _num(rec.get("wall_s"))
            and _int(rec.get("n_tokens"))
            and all(c is None or _int(c) for c in counts)
            and (rec.get("peak_in_flight") is None or _int(rec.get("peak_in_flight")))
            and _num(rec.get("mean_in_flight"), optional=True)
        )
    return True


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
