"""Incremental results: one JSONL line per completed unit, so a long run can resume.

The first line is a header holding the run's configuration; resuming with a different
configuration is refused (the units would not belong to one experiment).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError


class ProgressLog:
    """Completed units keyed by a string; ``path=None`` keeps them in memory only."""

    def __init__(self, path: Path | None, config: dict[str, Any], *, resume: bool) -> None:
        self.path = path
        self.config = json.loads(json.dumps(config))  # tuples -> lists, as read back
        self.done: dict[str, Any] = {}
        if path is None:
            return
        if resume and path.exists():
            self._load(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8") as f:
                f.write(json.dumps({"type": "header", "config": config}) + "\n")

    def _load(self, path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            with path.open("a", encoding="utf-8") as f:
                f.write("\n")  # end a line cut short by an interrupted run
        lines = text.splitlines()
        if not lines:
            raise ConfigError(f"cannot resume: {path} is empty")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as e:
            raise ConfigError(f"cannot resume: {path} has no valid header ({e})") from e
        if header.get("type") != "header" or header.get("config") != self.config:
            raise ConfigError(
                f"cannot resume from {path}: it was written with a different configuration "
                "(run without --resume to start over)"
            )
        for line in lines[1:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interrupted run: that unit is redone
            self.done[rec["key"]] = rec["value"]

    def get(self, key: str) -> Any | None:
        return self.done.get(key)

    def put(self, key: str, value: Any) -> None:
        self.done[key] = value
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "value": value}) + "\n")
