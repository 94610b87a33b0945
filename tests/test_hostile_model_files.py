"""Model files whose chat template attacks the library that loads them, not specdec's renderer.

llama-cpp-python's ``Llama()`` compiles every chat template of a GGUF with Jinja2 in-process,
and Jinja2 folds constant expressions while compiling: a template holding ``7 ** 77777777``
hung the load for minutes, one holding ``'a' * 10**9`` made it allocate 4.2 GB, before
specdec's bounded renderer ever saw them. specdec's loads compile no template
(``llama_trust.llama_params``). transformers' tokenizers keep the template text until
``apply_chat_template`` (which specdec never calls), checked here too.

Each load runs in a child process under a hang guard (a failing test, never a stuck suite);
the child reports its peak memory, which must stay near an ordinary load's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import llama_cpp_or_skip, make_tiny_hf, store_model_or_skip

HOSTILE = {
    "power": "{% set x = 7 ** 77777777 %}{{ x }}",  # Jinja2 folds it for minutes
    "string product": "{{ 'a' * 10**9 }}{% for m in messages %}{{ m.content }}{% endfor %}",
}
PEAK_MIB = 1500  # an ordinary load of SmolLM2 (or the tiny HF model) stays well under this
GUARD_S = 120  # hang guard: the fixed loads take a few seconds


def _child(code: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=GUARD_S
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


_PEAK = "import resource; peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024"


@pytest.fixture(scope="module")
def smol() -> Path:
    llama_cpp_or_skip()
    return store_model_or_skip()


@pytest.fixture(scope="module", params=sorted(HOSTILE))
def hostile_gguf(request: pytest.FixtureRequest, smol: Path, tmp_path_factory) -> Path:
    """SmolLM2 with its chat template replaced by a hostile one (a real GGUF, rewritten)."""
    out = tmp_path_factory.mktemp("hostile") / "smol-hostile.gguf"
    tool = Path(sys.executable).with_name("gguf-new-metadata")
    cmd = [str(tool), str(smol), str(out), "--chat-template", HOSTILE[request.param], "--force"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return out


def test_loading_a_gguf_compiles_none_of_its_templates(hostile_gguf: Path) -> None:
    code = f"""
import json
from specdec.models.llamacpp import LlamaCppLM
lm = LlamaCppLM({str(hostile_gguf)!r}, n_ctx=64, n_threads=1)
template = lm.tokenizer.chat_template
assert template is not None and ("77777777" in template or "10**9" in template)
assert lm.extend([1, 2, 3]).shape[0] == 3
{_PEAK}
print(json.dumps({{"peak_mib": peak}}))
"""
    assert _child(code)["peak_mib"] < PEAK_MIB


def test_the_hostile_template_renders_in_the_bounded_worker_as_one_error(
    hostile_gguf: Path,
) -> None:
    """The only place a model's template runs: specdec's renderer, which refuses it."""
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.prompting import encode_request

    lm = LlamaCppLM(hostile_gguf, n_ctx=64, n_threads=1)
    with pytest.raises(ValueError) as info:
        encode_request(lm, "hi")
    assert "\n" not in str(info.value)


def test_only_the_swapped_formatter_keeps_llama_cpp_python_from_compiling() -> None:
    """The hole is real: llama-cpp-python's own formatter compiles what it is given (a
    template that does not parse raises), and specdec's loads replace it for the load."""
    llama_cpp_or_skip()
    import llama_cpp
    from jinja2 import TemplateSyntaxError

    from specdec.llama_trust.llama_params import UncompiledTemplate, loading

    bad = "{% for %}"
    with loading(llama_cpp, templates=True):
        from llama_cpp import llama_chat_format

        with pytest.raises(TemplateSyntaxError):
            llama_chat_format.Jinja2ChatFormatter(template=bad, eos_token="", bos_token="")
    with loading(llama_cpp):
        kept = llama_chat_format.Jinja2ChatFormatter(template=bad, eos_token="", bos_token="")
        assert isinstance(kept, UncompiledTemplate) and kept.template == bad
        with pytest.raises(RuntimeError, match=r"specdec\.templates"):
            kept.to_chat_handler()()
    assert llama_chat_format.Jinja2ChatFormatter is not UncompiledTemplate  # restored


def test_a_transformers_tokenizer_keeps_a_hostile_template_uncompiled(tmp_path: Path) -> None:
    model = make_tiny_hf(tmp_path / "tiny", seed=0)
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = HOSTILE["power"]
    cfg_path.write_text(json.dumps(cfg))
    code = f"""
import json
from specdec.models.hf import load_hf
lm = load_hf({str(model)!r}, device="cpu", dtype="float32", n_ctx=64, n_threads=1)
assert "77777777" in lm.tokenizer.chat_template
{_PEAK}
print(json.dumps({{"peak_mib": peak}}))
"""
    assert _child(code)["peak_mib"] < PEAK_MIB
