"""Cached profiles: one JSON file per (machine, package versions, model files, backend
settings, probe prompts). Any change in those gives another key, so a stale profile is
never used; ``--refresh`` measures again whatever the cache holds."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specdec.hub.paths import default_cache_dir
from specdec.hub.safe_paths import read_regular, real_dir, write_new
from specdec.theory import Costs
from specdec.util import jsonbound
from specdec.util.machine import cpu_model, package_versions

SCHEMA = 1


def model_identity(ref: str) -> str:
    """What identifies a model's weights: the pinned SHA-256 for store models (verified when
    fetched), the SHA-256 of a local file, the files of a model directory by name, size and
    content hash, or the reference itself for mock models."""
    if ref.startswith("mock:"):
        return ref
    from specdec.hub import find_entry, sha256_file

    entry = find_entry(ref)
    if entry is not None:
        return f"sha256:{entry.sha256}"
    path = Path(ref).expanduser()
    if path.is_file():
        return f"sha256:{sha256_file(path)}"
    if path.is_dir():
        h = hashlib.sha256()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(path)}|{sha256_file(f)}".encode())
        return f"dir-sha256:{h.hexdigest()}"
    return f"ref:{ref}"


def machine_key() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "versions": package_versions(),
    }


def profile_key(
    *,
    target: str,
    drafts: Sequence[str],
    settings: Mapping[str, Any],
    prompts: Sequence[Sequence[int]] | Sequence[str],
    machine: Mapping[str, Any] | None = None,
) -> str:
    """A stable hash of everything a profile's numbers depend on."""
    blob = {
        "schema": SCHEMA,
        "costs_fields": sorted(Costs.__dataclass_fields__),  # a new cost term re-measures
        "machine": dict(machine) if machine is not None else machine_key(),
        "target": model_identity(target),
        "drafts": [model_identity(d) for d in drafts],
        "settings": dict(settings),
        "prompts": hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


PROFILE_DIR_ENV = "SPECDEC_PROFILES"
_MAX_PROFILE_BYTES = 64 << 20


def profile_dir(root: Path | None = None) -> Path:
    """``root``/profiles; by default ``$SPECDEC_PROFILES`` if set, else ``profiles`` in the
    model store."""
    if root is None:
        env = os.environ.get(PROFILE_DIR_ENV, "").strip()
        if env:
            return Path(env).expanduser()
    return (root if root is not None else default_cache_dir()) / "profiles"


def load_cached(
    key: str, root: Path | None = None, log: Callable[[str], None] | None = None
) -> dict[str, Any] | None:
    """The entry of ``key``: a JSON object holding its own key, else None (nothing there, or
    something damaged there: ``log`` hears one line about the latter, which is then measured
    again and replaced)."""
    path = profile_dir(root) / f"{key}.json"
    if not os.path.lexists(path):
        return None
    raw = read_regular(path, _MAX_PROFILE_BYTES)  # a FIFO or device there is no profile
    data = jsonbound.loads_or_none(raw) if raw is not None else None
    if isinstance(data, dict) and data.get("key") == key:
        return data
    if log is not None:
        why = (
            "not a regular file, or larger than 64 MiB"
            if raw is None
            else "not JSON (or nested too deeply)"
            if data is None
            else "not an entry of this key"
        )
        log(f"ignoring the damaged cache entry {path} ({why}): measuring again")
    return None


def save(key: str, data: Mapping[str, Any], root: Path | None = None) -> Path:
    """Write atomically (a half-written profile is never read)."""
    d = profile_dir(root)
    d = real_dir(d.parent, d.name)  # a link planted there is refused, not followed
    path = d / f"{key}.json"
    write_new(path, json.dumps({**data, "key": key}, indent=1).encode())  # inf costs stay inf
    return path
