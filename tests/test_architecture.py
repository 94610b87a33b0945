"""The architecture step: one round, one loop, one public API, imports that point down."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

import specdec
from specdec.certify.shape_matched import shape_matched_generate
from specdec.core.detokenize import IncrementalDecoder
from specdec.core.loop import Generation, generate, generate_stream
from specdec.core.model import extend_last, supports_last_only
from specdec.core.sampling import SamplingConfig, make_generator
from specdec.core.verifiers import exact_match_verifier, rejection_verifier
from specdec.errors import ConfigError, EmptyPromptError
from specdec.models.mock import MockLM, mock_pair

SRC = Path(specdec.__file__).parent


# -- imports point down: no cycle between the package's units ---------------------------------


def _unit(module: str) -> str:
    """specdec.models.hf -> models; specdec.core.loop -> core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        src = _unit(module)
        graph.setdefault(src, set())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    targets = [f"{base}.{node.module}" if node.module else base]
                elif node.module:
                    targets = [node.module]
            for t in targets:
                if t.startswith("specdec.") and _unit(t) != src:
                    graph[src].add(_unit(t))
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)) is not None:
            return found
    return None


def test_the_package_units_import_without_a_cycle() -> None:
    graph = _import_graph()
    assert {"models", "drafters", "hub", "core", "util", "pairs", "cli"} <= set(graph)
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = _import_graph()
    graph["hub"] = {*graph["hub"], "cli"}  # the store importing the command line
    assert _find_cycle(graph) is not None


def test_models_do_not_import_drafters_and_the_core_not_the_tools() -> None:
    graph = _import_graph()
    assert "drafters" not in graph["models"]
    for low in ("models", "drafters", "hub", "core", "util", "mock_runs"):
        assert not graph[low] & {"bench", "certify", "cli", "pairs", "api", "serve"}, low
    assert "drafters" not in graph["core"]  # the drafters sit on the core's Drafter and sampling
    assert _core_reaching_backends(graph) == []
    assert graph["util"] <= {"errors"}  # the utilities sit below everything
    assert "serve" not in graph["api"] and "cli" not in graph["serve"]  # the server sits on top


def _core_reaching_backends(graph: dict[str, set[str]]) -> list[str]:
    """What the core imports of the backends: nothing, because it defines the model interface
    (core.model) that the backends (models/) implement."""
    return sorted(graph["core"] & {"models", "hub", "templates"})


def test_the_core_rule_catches_the_core_importing_a_backend() -> None:
    planted = _import_graph()
    planted["core"] = {*planted["core"], "models"}
    assert _core_reaching_backends(planted) == ["models"]


# -- file-level rules ---------------------------------------------------------------------------


def _module_of(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _file_graph() -> dict[str, set[str]]:
    """module -> the specdec modules it imports (at any depth in the file: lazy imports count),
    ``from pkg import name`` resolved to the submodule ``pkg.name`` when there is one."""
    modules = {_module_of(p) for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        module = _module_of(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                subs = {f"{target}.{a.name}" for a in node.names} & modules
                found.update(subs or {target})
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def test_no_file_imports_itself_around_a_circle_even_inside_a_package() -> None:
    cycle = _find_cycle(_file_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_command_line_goes_through_the_public_api() -> None:
    """cli/ imports neither the loop nor the K policies: it loads and generates through
    ``specdec.api`` (the configuration resolved in ``specdec.configuration``)."""
    graph = _file_graph()
    for module, targets in graph.items():
        if module.startswith("specdec.cli"):
            assert not targets & {
                "specdec.core.loop",
                "specdec.core.round",
                "specdec.core.policy",
            }, module


def test_loading_a_pair_imports_no_measurement_tool() -> None:
    reached = _reaches(_file_graph(), "specdec.api")
    tools = sorted(m for m in reached if m.split(".")[1] in ("bench", "certify", "endpoint", "cli"))
    assert tools == []


def test_the_file_rules_catch_what_they_forbid() -> None:
    """The fixtures each rule must fail on: a planted cycle, a planted import."""
    graph = _file_graph()
    graph["specdec.core.model"] = {*graph["specdec.core.model"], "specdec.models.mock"}
    graph["specdec.models.mock"] = {*graph["specdec.models.mock"], "specdec.core.model"}
    assert _find_cycle(graph) is not None
    graph["specdec.profiler.auto"] = {*graph["specdec.profiler.auto"], "specdec.bench.runner"}
    assert "specdec.bench.runner" in _reaches(graph, "specdec.api")


TRUST = "specdec.llama_trust"


def _trust_importers(graph: dict[str, set[str]]) -> list[str]:
    """The modules outside the llama.cpp trust subsystem that import it, other than the
    backends (models/) and the doctor: none (the tools reach it through models.llamacpp)."""
    return sorted(
        m
        for m, targets in graph.items()
        if not m.startswith((TRUST, "specdec.models.")) and m != "specdec.doctor"
        if any(t == TRUST or t.startswith(TRUST + ".") for t in targets)
    )


def test_the_llama_cpp_trust_subsystem_is_imported_by_the_backends_and_the_doctor_alone() -> None:
    graph = _file_graph()
    assert any(m.startswith(TRUST + ".") for m in graph)  # the package is where it is
    assert _trust_importers(graph) == []
    planted = _file_graph()
    planted["specdec.profiler.run"] = {*planted["specdec.profiler.run"], TRUST + ".kernel_check"}
    assert _trust_importers(planted) == ["specdec.profiler.run"]


def _model_work_reaching_up(graph: dict[str, set[str]]) -> list[str]:
    """What the certificate's model work (``core.rows``: rows from a model and plain
    arguments) imports besides the model interface and the errors."""
    return sorted(
        f"specdec.core.rows -> {t}"
        for t in graph["specdec.core.rows"]
        if t not in ("specdec.core.model", "specdec.errors")
    )


def test_the_certificates_model_work_sits_on_the_model_interface_alone() -> None:
    """``core.rows`` computes the rows the certificate's levels test from a ``CausalLM`` and
    plain arguments (pass shapes, not the core's rounds): it imports only ``core.model`` (and
    the errors), so the levels call down into it and run their statistics on what it
    returns."""
    assert _model_work_reaching_up(_file_graph()) == []
    planted = _file_graph()
    planted["specdec.core.rows"] = {*planted["specdec.core.rows"], "specdec.core.result"}
    assert _model_work_reaching_up(planted) == ["specdec.core.rows -> specdec.core.result"]


def test_the_endpoint_client_sits_below_both_tools_that_use_it() -> None:
    """specdec.endpoint (client, wire, schema, ...) is what the endpoint bench and the endpoint
    certificate share: it imports neither tool, so both can import it without a cycle."""
    assert _client_reaching_up(_file_graph()) == []
    planted = _file_graph()
    planted["specdec.endpoint.client"] = {*planted["specdec.endpoint.client"], "specdec.certify"}
    assert _client_reaching_up(planted) == ["specdec.endpoint.client -> specdec.certify"]


def _client_reaching_up(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} -> {t}"
        for module, targets in graph.items()
        if module.startswith("specdec.endpoint")
        for t in targets
        if t.split(".")[1] in ("bench", "certify", "cli")
    )


def _class_names(root: Path) -> dict[str, list[str]]:
    """Every class name defined under ``root`` -> where (file:line), from the AST."""
    where: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{path.relative_to(root)}:{node.lineno}")
    return where


def _clashes(where: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: places for name, places in where.items() if len(places) > 1}


def test_one_name_per_class() -> None:
    """No two classes in the package share a name (one name per concept)."""
    assert _clashes(_class_names(SRC)) == {}


def test_the_class_name_check_finds_a_planted_clash(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class Result:\n    pass\n")
    (tmp_path / "b.py").write_text("def f():\n    class Result:\n        pass\n")
    assert set(_clashes(_class_names(tmp_path))) == {"Result"}


@pytest.mark.parametrize("argv", [["--help"], ["models", "list"], ["models", "--help"]])
def test_light_commands_do_not_import_torch(argv: list[str], tmp_path: Path) -> None:
    code = (
        "import sys\nfrom specdec.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
    )
    env_cache = {"SPECDEC_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env_cache},
    )
    assert proc.stderr.strip().splitlines()[-1] == "NO-TORCH", proc.stderr


# -- one loop: the round, the verifiers and the Generation handle ------------------------------


def test_generate_stream_returns_its_result_and_generate_has_its_parameters() -> None:
    import inspect

    draft, target = mock_pair("close", vocab_size=16)
    run = generate_stream(target, draft, [0, 4], max_new_tokens=20, k=3, seed=2)
    assert isinstance(run, Generation) and run.result is None
    streamed = [t for ev in run for t in ev.tokens]
    assert run.result is not None and run.result.tokens == streamed
    assert inspect.signature(generate).parameters == inspect.signature(generate_stream).parameters
    assert inspect.signature(generate).return_annotation == "GenerationResult"


def test_errors_surface_at_the_call_not_at_the_first_round() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    with pytest.raises(EmptyPromptError):
        generate_stream(target, draft, [], max_new_tokens=4)
    with pytest.raises(ConfigError):
        generate_stream(target, draft, [0, 4], max_new_tokens=4, k=-1)


def test_reuse_prefix_false_prefills_again() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    prompt = [0, 3, 4, 5, 6, 7, 8, 9]
    kw = {"max_new_tokens": 4, "k": 2, "stop_on_eos": False}
    generate(target, draft, prompt, **kw)  # type: ignore[arg-type]
    before_t, before_d = target.tokens_processed, draft.tokens_processed
    generate(target, draft, prompt, reuse_prefix=True, **kw)  # type: ignore[arg-type]
    reused_t = target.tokens_processed - before_t
    reused_d = draft.tokens_processed - before_d
    before_t, before_d = target.tokens_processed, draft.tokens_processed
    generate(target, draft, prompt, reuse_prefix=False, **kw)  # type: ignore[arg-type]
    fresh_t = target.tokens_processed - before_t
    fresh_d = draft.tokens_processed - before_d
    # the prompt minus its last token is prefilled again on both sides, and only then
    assert fresh_t - reused_t == len(prompt) - 1
    assert fresh_d - reused_d == len(prompt) - 1


def test_exact_match_verifier_keeps_what_rejection_keeps_when_greedy() -> None:
    g = make_generator(0)
    for _ in range(50):
        best = torch.randn(5, 12, generator=g).argmax(-1)  # [K+1] greedy tokens
        p = torch.nn.functional.one_hot(best, 12).double()  # [K+1, V] greedy rows
        n_ok = int(torch.randint(0, 5, (), generator=g))  # drafts that match
        drafts = best[:4].clone()  # [K]
        if n_ok < 4:
            drafts[n_ok] = (best[n_ok] + 1) % 12
        q = torch.nn.functional.one_hot(drafts, 12).double()  # [K, V]
        expected = (n_ok, int(best[n_ok]))
        assert exact_match_verifier(p, q, drafts, make_generator(1)) == expected
        assert rejection_verifier(p, q, drafts, make_generator(1)) == expected


def test_shape_matched_baseline_is_the_loop_with_the_exact_match_verifier() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    cfg = SamplingConfig(0.9)
    toks, rounds = shape_matched_generate(
        target, draft, [0, 4], max_new_tokens=30, k=3, sampling=cfg, seed=7
    )
    from specdec.certify.seeds import derive_seed

    again = generate(
        target,
        draft,
        [0, 4],
        max_new_tokens=30,
        k=3,
        sampling=cfg,
        seed=7,
        reuse_prefix=False,
        verifier=exact_match_verifier,
        draft_seed=derive_seed(7, "shape-matched-draft"),
    )
    assert toks == again.tokens
    assert [r.n_matched for r in rounds] == [r.n_accepted for r in again.rounds]


# -- the protocol: last_only is optional --------------------------------------------------------


class TwoMethodLM:
    """A backend written to the two-method protocol of the design (no last_only keyword)."""

    def __init__(self, inner: MockLM) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.eos_token_ids = inner.eos_token_ids
        self.n_ctx = inner.n_ctx
        self.tokenizer = inner.tokenizer

    @property
    def n_cached(self) -> int:
        return self.inner.n_cached

    def extend(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.inner.extend(tokens)

    def truncate(self, n_keep: int) -> None:
        self.inner.truncate(n_keep)


def test_a_two_method_backend_generates_the_same_tokens() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    ref = generate(target, draft, [0, 4, 5], max_new_tokens=25, k=3, seed=3)
    d2, t2 = mock_pair("close", vocab_size=16)
    plain_t, plain_d = TwoMethodLM(t2), TwoMethodLM(d2)
    assert not supports_last_only(plain_t) and supports_last_only(t2)
    res = generate(plain_t, plain_d, [0, 4, 5], max_new_tokens=25, k=3, seed=3)  # type: ignore[arg-type]
    assert res.tokens == ref.tokens
    row = extend_last(TwoMethodLM(mock_pair("close", vocab_size=16)[1]), [0, 4, 5])
    assert tuple(row.shape) == (1, 16)


# -- the public API and the incremental detokenizer ---------------------------------------------


def test_specdec_load_generate_and_stream() -> None:
    mock = {"target_backend": "mock", "draft_backend": "mock", "n_ctx": 256}
    pair = specdec.load("mock:target", "mock:close", **mock)  # type: ignore[arg-type]
    done = pair.generate([0, 4, 5], max_new_tokens=12, k=3, stop_on_eos=False)
    assert len(done.tokens) == 12 and str(done) == done.text
    assert done.text == pair.target.tokenizer.decode(done.tokens)
    stream = pair.stream([0, 4, 5], max_new_tokens=12, k=3, stop_on_eos=False)
    assert "".join(stream) == done.text
    assert stream.completion is not None and stream.completion.tokens == done.tokens
    plain = specdec.load("mock:target", None, **mock).generate(  # type: ignore[arg-type]
        [0, 4, 5], max_new_tokens=12, stop_on_eos=False
    )
    assert plain.tokens == done.tokens  # greedy: speculative output is the target's own


class ByteTokenizer:
    """One token per UTF-8 byte: multi-byte characters span tokens."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_incremental_decoder_never_splits_a_character(chunk: int) -> None:
    text = "héllo wörld 東京 🙂🚀 done"
    ids = ByteTokenizer().encode(text)
    dec = IncrementalDecoder(ByteTokenizer())
    pieces = [dec.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    pieces.append(dec.flush())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_incremental_decoder_flushes_an_incomplete_character() -> None:
    dec = IncrementalDecoder(ByteTokenizer())
    assert dec.push(list("a🙂".encode())[:-1]) == ""  # held back with the broken character
    assert dec.flush() == "a\ufffd"


# -- one cache-directory rule for the store and the transformers conversion cache ------------


@pytest.mark.parametrize("value", ["", "   ", "~/specdec-cache-test"])
def test_conversion_cache_follows_the_store_rule(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdec import hub
    from specdec.models.hf import converted_dir_for

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(hub.CACHE_ENV, value)
    root = converted_dir_for(gguf).parent.parent
    assert root == hub.default_cache_dir()
    assert root.is_absolute() and "~" not in str(root)
    assert root.is_relative_to(tmp_path / "home")


def test_greedy_verify_equals_both_verifiers_on_one_hot_rows() -> None:
    from specdec.core.sampling import GREEDY, logits_to_probs
    from specdec.core.verifiers import greedy_verify

    g = make_generator(3)
    for _ in range(200):
        logits = torch.randint(0, 4, (5, 9), generator=g).float()  # [K+1, V] with many ties
        drafts = torch.randint(0, 9, (4,), generator=g)
        best = logits.argmax(-1)
        n_ok = int(torch.randint(0, 5, (), generator=g))
        drafts[:n_ok] = best[:n_ok]
        p = logits_to_probs(logits, GREEDY)
        q = torch.nn.functional.one_hot(drafts, 9).float()
        want = rejection_verifier(p, q, drafts, make_generator(0))
        assert greedy_verify(logits, drafts.tolist()) == want
        assert exact_match_verifier(p, q, drafts, make_generator(0)) == want


def test_a_plugged_in_verifier_is_used_on_greedy_rounds_too() -> None:
    """The greedy fast path stands in only for the built-in verifiers (proven equal above);
    any other verifier gets its rows every round."""
    calls: list[int] = []

    def counting(p, q, drafts, generator):  # type: ignore[no-untyped-def]
        calls.append(int(drafts.numel()))
        return rejection_verifier(p, q, drafts, generator)

    draft, target = mock_pair("close", vocab_size=16)
    res = generate(
        target, draft, [0, 4], max_new_tokens=20, k=3, verifier=counting, stop_on_eos=False
    )
    assert len(calls) == len(res.rounds)
    plain = generate(target, None, [0, 4], max_new_tokens=20, k=0, stop_on_eos=False)
    assert res.tokens == plain.tokens
