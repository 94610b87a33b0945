"""The results file: JSON lines, appended and fsynced one record at a time.

Record types (field ``type``):
  header       one per session (a run, or a resumed run): machine, versions, argv, plan
  profile      one per configuration: verify scaling, step latencies, c
  measurement  one per generation: key fields, speed, acceptance counts, time split
  skip         a prompt that cannot run on a configuration (e.g. too long), with the reason

A crash or Ctrl-C can only leave a partial last line; readers ignore it and ``open_for_append``
cuts it off before appending, so a resumed file stays one valid record per line.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.bench.record_types import record_problem
from specdec.errors import ConfigError
from specdec.util.textfiles import loads_or_none, read_bytes, require_regular

MAX_RESULTS_BYTES = 1 << 30  # a results file (a long sweep writes tens of MB)

SCHEMA_VERSION = 1
Key = tuple[str, str, str, int, int]  # (config, mode, prompt_id, repeat, k)


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN / inf become None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


# fields of a measurement record that the analysis reads directly (beyond the key)
REPORTED_FIELDS = ("category", "tokens_per_second")  # speedup is derived (attach_speedups)


def measurement_key(rec: dict[str, Any]) -> Key:
    return (
        str(rec["config"]),
        str(rec["mode"]),
        str(rec["prompt_id"]),
        int(rec["repeat"]),
        int(rec["k"]),
    )


@dataclass
class Results:
    """Everything read back from a results file."""

    headers: list[dict[str, Any]] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    skips: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)  # unparsable lines (1-based), not last
    partial_tail: bool = False  # the last line was cut short (a crash mid-write)

    def keys(self) -> set[Key]:
        return {measurement_key(m) for m in self.measurements}

    def profile_for(self, config: str) -> dict[str, Any] | None:
        """The latest profile record of a configuration."""
        found = [p for p in self.profiles if p.get("config") == config]
        return found[-1] if found else None


def parse_records(lines: Iterable[str], ends_with_newline: bool = True) -> Results:
    res = Results()
    lines = list(lines)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec = loads_or_none(line)  # deeply nested JSON included
        if not isinstance(rec, dict):
            if i == len(lines) and not ends_with_newline:
                res.partial_tail = True
            else:
                res.bad_lines.append(i)
            continue
        if record_problem(rec) is not None:  # right names, wrong types: unreadable
            res.bad_lines.append(i)
            continue
        kind = rec.get("type")
        if kind == "header":
            res.headers.append(rec)
        elif kind == "profile":
            res.profiles.append(rec)
        elif kind == "measurement":
            try:
                measurement_key(rec)
            except (KeyError, TypeError, ValueError):
                res.bad_lines.append(i)
                continue
            if any(f not in rec for f in REPORTED_FIELDS):
                res.bad_lines.append(i)  # the report could not place it
                continue
            res.measurements.append(rec)
        elif kind == "skip":
            res.skips.append(rec)
        else:
            res.bad_lines.append(i)
    return res


def read_results(path: str | Path) -> Results:
    """Read a results file, tolerating a partial last line (and counting other bad lines)."""
    p = Path(path)
    require_regular(p, "results file")  # a FIFO or /dev/zero: an error, not a hang
    data = read_bytes(p, "results file", MAX_RESULTS_BYTES)  # and bounded in size
    text = data.decode("utf-8", errors="replace")
    return parse_records(text.split("\n"), ends_with_newline=text.endswith("\n") or not text)


def _repair_tail(path: Path) -> bool:
    """Cut a partial last line off the file; True when something was cut."""
    with path.open("rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        cut = data.rfind(b"\n") + 1  # 0 when the file is one partial line
        tail = data[cut:]
        try:
            json.loads(tail.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())
            return True
        f.write(b"\n")  # a complete record that only missed its newline
        f.flush()
        os.fsync(f.fileno())
        return False


class ResultsWriter:
    """Appends records to a JSONL file; every record is flushed and fsynced before returning."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(clean(record), allow_nan=False, separators=(",", ":"))
        self._f.write(line + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _holds_no_results(p: Path) -> bool:
    """True for a file of session headers only (no measurement, profile or skip record and
    nothing unreadable)."""
    try:
        res = read_results(p)
    except ConfigError:
        return False
    return not (res.measurements or res.profiles or res.skips or res.bad_lines or res.partial_tail)


def check_own_file(p: Path, header_type: str) -> None:
    """ConfigError unless the first record of ``p`` is a ``header_type`` record: --resume
    appends only to a file this kind of run wrote (not to another tool's file, nor a local
    bench's file to an endpoint run or back)."""
    require_regular(p, "results file")
    with p.open("rb") as f:
        first = b""
        while not first.strip():
            first = f.readline(1 << 20)
            if not first:
                return  # blank: nothing to protect
    rec = loads_or_none(first)
    if not (isinstance(rec, dict) and rec.get("type") == header_type):
        raise ConfigError(
            f"{p} was not written by this kind of specdec bench run (its first line is not a "
            f"{header_type!r} record): refusing to append to it; choose another --out"
        )


def open_for_append(
    path: str | Path, *, resume: bool, overwrite: bool, header_type: str = "header"
) -> tuple[ResultsWriter, Results, bool]:
    """Open the results file for a run: (writer, what was already there, partial line cut).

    Without resume or overwrite an existing non-empty file is an error (nothing is lost by
    accident); with resume its records are read back so finished measurements are skipped,
    and only from a file whose first record is a ``header_type`` record.
    """
    p = Path(path)
    existing = Results()
    cut = False
    if p.exists() and p.stat().st_size > 0 and not resume and _holds_no_results(p):
        p.unlink()  # only session headers (a run that failed before measuring): nothing to lose
    if p.exists() and p.stat().st_size > 0:
        if resume:
            check_own_file(p, header_type)  # before anything in it is touched
            cut = _repair_tail(p)
            existing = read_results(p)
        elif overwrite:
            p.unlink()
        else:
            raise ConfigError(
                f"{p} already holds results; pass --resume to continue it or --overwrite to "
                "replace it"
            )
    elif p.exists() and overwrite:
        p.unlink()
    p.parent.mkdir(parents=True, exist_ok=True)
    return ResultsWriter(p), existing, cut
