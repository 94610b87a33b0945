"""The cache's one file-system rule: never follow a link that specdec did not create.

Everything specdec writes or deletes under its cache (the model store, its wheels, the
transformers conversions, requantized files, profiles) goes through these helpers, so a
symbolic link planted inside the cache (``wheels -> /home/victim``, ``<dir>.partial ->
/home/victim/project``) can neither redirect a write nor a delete outside it:

- ``real_dir(root, *parts)``: the directories below ``root``, created one level at a time;
  one that is a link is refused (the cache root itself may be a link: that is where the user
  put the cache);
- ``fresh_dir(path)``: an empty directory that is really at ``path`` (whatever was there,
  a link included, is removed without following it; then created exclusively);
- ``create_new(path)``: a new file really at ``path`` (created exclusively, without
  following links);
- ``remove_tree(path)``: a link is unlinked, never followed; a real directory is removed;
  ``remove_below(root, *parts)`` does so only when no level on the way is a link.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from specdec.errors import ModelLoadError


def refuse_link(path: Path) -> None:
    """The store never uses a path that is a symlink (it creates none itself)."""
    if path.is_symlink():
        raise ModelLoadError(
            f"{path} is a symbolic link, which the model store never creates: remove it"
        )


def real_dir(root: Path, *parts: str) -> Path:
    """``root / parts...``, each level below ``root`` a real directory (created if missing;
    a link is refused). ``root`` is created with its parents if missing."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelLoadError(f"cannot create the model cache {root}: {e.strerror or e}") from e
    path = root
    for part in parts:
        path = path / part
        refuse_link(path)
        try:
            path.mkdir(exist_ok=True)
        except OSError as e:
            raise ModelLoadError(f"cannot create {path}: {e.strerror or e}") from e
        refuse_link(path)  # planted in between: refuse rather than follow
        if not path.is_dir():
            raise ModelLoadError(f"{path} is not a directory")
    return path


def remove_tree(path: Path) -> None:
    """Remove ``path`` whatever it is, without following a link (best effort)."""
    try:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def remove_below(root: Path, *parts: str) -> None:
    """Remove ``root / parts...`` unless a level below ``root`` is a link (then nothing is
    removed: the path leads outside the cache)."""
    path = root
    for part in parts[:-1]:
        path = path / part
        if path.is_symlink() or not path.is_dir():
            return
    remove_tree(path / parts[-1])


def fresh_dir(path: Path) -> Path:
    """An empty directory that is really at ``path``: what was there is removed (a link is
    unlinked, not followed), then the directory is created exclusively."""
    remove_tree(path)
    try:
        path.mkdir()
    except FileExistsError as e:
        raise ModelLoadError(f"{path} appeared while specdec was creating it: refusing") from e
    return path


def create_new(path: Path) -> BinaryIO:
    """Open a fresh file for writing that is really at ``path``: whatever is there (a stale
    file, or a symlink someone planted) is removed, then the file is created exclusively
    without following links, so a link planted in between fails instead of being followed."""
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError as e:
        raise ModelLoadError(f"{path} appeared while the store was writing it: refusing") from e
    return os.fdopen(fd, "wb")


def write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, through a fresh temporary file (never through
    a link planted at either name)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with create_new(tmp) as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:  # a full disk, a directory at ``path``: no .tmp file left behind
        with contextlib.suppress(OSError):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink()
        raise


def read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes, else None.
    Opened without blocking and without following a link: a FIFO or device planted in its
    place can neither block the reader nor feed it forever."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def read_json(path: Path, limit: int = 1 << 20) -> object | None:
    """The JSON value in ``path`` (``read_regular``'s rules: a regular file of at most
    ``limit`` bytes, never a FIFO, a device or a link), or None for anything else, text that
    is not JSON included, or JSON nested too deeply (``util.jsonbound``)."""
    from specdec.util import jsonbound

    raw = read_regular(path, limit)
    return None if raw is None else jsonbound.loads_or_none(raw)
