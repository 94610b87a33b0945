"""Incremental results: one JSONL line per completed unit, so a long run can resume.

The first line is a header holding the run's configuration; resuming with a different
configuration is refused (the units would not belong to one experiment). ``--resume`` with
no progress file where it is asked for is refused too (it used to start over silently, so a
typo in ``--out`` cost the whole run).

The file is read back as untrusted input (it may be cut short by a crash, or not be what it
seems): through ``textfiles.read_bytes`` (a size bound; a FIFO or a device is an error, not a
hang), one record per line decoded by ``jsonbound`` (a depth bound), and each record must be
an object with a string ``key``; a line that is not (a line cut short) is redone. What a
unit's value must hold is checked by ``revive`` where it is read back.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from specdec.errors import ConfigError
from specdec.util import jsonbound
from specdec.util.textfiles import read_bytes

MAX_PROGRESS_BYTES = 1 << 30  # a full certificate writes a few MB
T = TypeVar("T")


class ProgressLog:
    """Completed units keyed by a string; ``path=None`` keeps them in memory only."""

    def __init__(self, path: Path | None, config: dict[str, Any], *, resume: bool) -> None:
        self.path = path
        self.done: dict[str, Any] = {}
        header: Any = None
        if path is None:
            if resume:
                raise ConfigError("cannot resume: no output directory to resume from")
        elif resume:
            if not path.parent.is_dir():
                raise ConfigError(
                    f"cannot resume: the output directory {path.parent} does not exist (run "
                    "without --resume to start there, or name the directory of the run)"
                )
            if not path.exists():
                raise ConfigError(
                    f"cannot resume: {path.parent} holds no {path.name} (no run to continue "
                    "there; run without --resume to start one)"
                )
            header, self.done = read_log(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8") as f:
                f.write(json.dumps({"type": "header", "config": config}) + "\n")
        # the header is checked here and not kept: the log holds units, not the experiment
        if path is not None and resume and not _same_run(header, _as_read_back(config)):
            raise ConfigError(
                f"cannot resume from {path}: it was written with a different configuration "
                "(run without --resume to start over)"
            )

    @classmethod
    def memory(cls) -> ProgressLog:
        """A log that keeps its units in memory only (a run without an output directory)."""
        return cls(None, {}, resume=False)

    def unit(self, key: str, compute: Callable[[], T], kind: type[T]) -> T:
        """The unit under ``key``, a dataclass of ``kind``: read back when it is done, else
        ``compute``d and stored, so that a resumed run redoes only the units it lacks."""
        done = self.read(key, lambda v: revive(kind, v))
        if done is not None:
            return done
        value = compute()
        self.put(key, dataclasses.asdict(value))  # type: ignore[call-overload]
        return value

    def units(self, key: str, compute: Callable[[], list[T]], kind: type[T]) -> list[T]:
        """``unit`` for a list of dataclasses of ``kind`` stored under one key."""
        done = self.read(key, lambda v: [revive(kind, x) for x in v])
        if done is not None:
            return done
        values = compute()
        self.put(key, [dataclasses.asdict(x) for x in values])  # type: ignore[call-overload]
        return values

    def get(self, key: str) -> Any | None:
        return self.done.get(key)

    def read(self, key: str, build: Callable[[Any], T]) -> T | None:
        """The unit stored under ``key`` built by ``build`` (None when not done); a value
        ``build`` cannot use (a TypeError, KeyError or ValueError) is one ConfigError naming
        the file and the unit."""
        value = self.done.get(key)
        if value is None:
            return None
        try:
            return build(value)
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            where = self.path or "the progress log"
            raise ConfigError(
                f"cannot resume from {where}: the stored unit {key!r} is not what this run "
                f"wrote ({e}); run without --resume to start over"
            ) from e

    def put(self, key: str, value: Any) -> None:
        self.done[key] = value
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "value": value}) + "\n")


def read_log(path: Path) -> tuple[Any, dict[str, Any]]:
    """(header, completed units) of a progress file. A last line cut short by an interrupted
    run is ended in the file (its unit is redone); a line that is not a record is left out."""
    raw = read_bytes(path, "the progress file", MAX_PROGRESS_BYTES)
    text = raw.decode("utf-8", errors="replace")
    if text and not text.endswith("\n"):
        with path.open("a", encoding="utf-8") as f:
            f.write("\n")  # end a line cut short by an interrupted run
    lines = text.splitlines()
    if not lines:
        raise ConfigError(f"cannot resume: {path} is empty")
    try:
        header = jsonbound.loads(lines[0])
    except jsonbound.JsonError as e:
        raise ConfigError(f"cannot resume: {path} has no valid header ({e})") from e
    done: dict[str, Any] = {}
    for line in lines[1:]:
        rec = jsonbound.loads_or_none(line)
        if isinstance(rec, dict) and isinstance(rec.get("key"), str) and "value" in rec:
            done[rec["key"]] = rec["value"]
        # else: a line cut short by an interrupted run (or not a record): that unit is redone
    return header, done


def _as_read_back(config: dict[str, Any]) -> Any:
    """``config`` as a JSON file gives it back (tuples become lists)."""
    return json.loads(json.dumps(config))


def _same_run(header: Any, config: dict[str, Any]) -> bool:
    """Whether a progress file's header line is this run's (``config`` as read back)."""
    return (
        isinstance(header, dict)
        and header.get("type") == "header"
        and header.get("config") == config
    )


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value read back fits a field's type (the simple types a unit holds:
    numbers, strings, booleans, None, lists, dicts and dataclasses of those)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value if args)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return True  # a type this check does not know: left to the dataclass


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field's type names (``Divergence | None`` -> Divergence), or None."""
    for h in (hint, *typing.get_args(hint)):
        if isinstance(h, type) and dataclasses.is_dataclass(h):
            return h
    return None


def revive(cls: type[T], value: Any) -> T:
    """``cls(**value)`` for a dataclass, after checking that ``value`` is an object whose
    fields are the class's and fit their types (``_fits``); nested dataclasses are revived
    the same way. A TypeError names the first field that does not fit."""
    if not isinstance(value, dict):
        raise TypeError(f"{cls.__name__} is stored as {type(value).__name__}, not an object")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    extra = set(value) - known
    if extra:
        raise TypeError(f"{cls.__name__} has no field {sorted(extra)[0]!r}")
    out = {}
    for name, v in value.items():
        hint = hints[name]
        if not _fits(v, hint):
            raise TypeError(f"{cls.__name__}.{name} holds {type(v).__name__}")
        sub = _dataclass_in(hint)
        out[name] = revive(sub, v) if sub is not None and isinstance(v, dict) else v
    return cls(**out)
