"""Which grammar engine specdec uses for structured outputs, measured on this machine: the
three maintained engines on PyPI (llguidance, xgrammar, outlines-core) over the default
target's vocabulary (Qwen2.5, 151,936 tokens, read from the GGUF the way specdec reads it),
on a realistic JSON schema (an invoice: nested objects, an array of objects, enums, an
optional field, a date pattern; the shape a Pydantic model gives) and on "any JSON".

Per engine, each in its own process (so that no engine's caches or memory touch another's):
- setup: its tokenizer built from the vocabulary (once per model in a server);
- compile: the schema to a matcher ready to mask (once per new schema);
- mask: the time to fill the next-token bitmask (151,936 bits) at every position of a
  pretty-printed instance of the schema (302 tokens, EOS last), then consume the token;
  the first walk separately (engines that build lazily pay there), then ``--walks`` more;
- rollback of 16 tokens and re-consuming them, a fork (deep copy) of a matcher, and how
  many of 16 drafted tokens are legal (the engine's batch check where it has one);
- pathological inputs (deep nesting, a huge enum, counted repetitions, a grammar that can
  never end), each in a fresh process with a 60 s limit: its compile and first-mask time,
  its peak memory, and what the engine said.
Then once, engine-independent: applying a bitmask to a float32 row of 151,936 logits (the
way ``constraints.processor`` does: numpy's unpackbits, one masked_fill).

    PYTHONPATH=src:/tmp/gram-pkgs /work/bin/cpu-quiet \\
        python benchmarks/studies/grammar_engines.py \\
        --out benchmarks/results/grammar-engines.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENGINES = ("llguidance", "llguidance-specdec", "xgrammar", "outlines-core")

INVOICE_SCHEMA: dict[str, Any] = {
    "$defs": {
        "Address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "postal_code": {"type": "string"},
                "country": {"type": "string", "enum": ["DE", "FR", "GB", "US", "JP"]},
            },
            "required": ["street", "city", "postal_code", "country"],
            "additionalProperties": False,
        },
        "LineItem": {
            "type": "object",
            "properties": {
                "sku": {"type": "string"},
                "description": {"type": "string"},
                "quantity": {"type": "integer"},
                "unit_price": {"type": "number"},
                "tax_rate": {"type": "string", "enum": ["standard", "reduced", "zero"]},
            },
            "required": ["sku", "description", "quantity", "unit_price", "tax_rate"],
            "additionalProperties": False,
        },
    },
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string"},
        "issued": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "billing_address": {"$ref": "#/$defs/Address"},
            },
            "required": ["name", "email", "billing_address"],
            "additionalProperties": False,
        },
        "items": {"type": "array", "items": {"$ref": "#/$defs/LineItem"}},
        "paid": {"type": "boolean"},
        "notes": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["invoice_number", "issued", "currency", "customer", "items", "paid", "notes"],
    "additionalProperties": False,
}

INVOICE = {
    "invoice_number": "INV-2026-00417",
    "issued": "2026-11-30",
    "currency": "EUR",
    "customer": {
        "name": "Müller & Söhne GmbH",
        "email": "accounts@mueller-soehne.example",
        "billing_address": {
            "street": "Hauptstraße 12",
            "city": "Stuttgart",
            "postal_code": "70173",
            "country": "DE",
        },
    },
    "items": [
        {
            "sku": f"PART-{i:04d}",
            "description": d,
            "quantity": q,
            "unit_price": p,
            "tax_rate": t,
        }
        for i, (d, q, p, t) in enumerate(
            [
                ("Stainless steel hex bolts M8x40, box of 100", 12, 18.5, "standard"),
                ("Torque wrench 20-100 Nm with calibration certificate", 1, 149.0, "standard"),
                ("Safety gloves, cut level D, size 9", 40, 6.25, "reduced"),
                ("Technical manual (printed)", 2, 0.0, "zero"),
            ]
        )
    ],
    "paid": False,
    "notes": None,
}

PATHOLOGICAL: dict[str, tuple[str, Any]] = {
    "nested objects, 120 levels": ("json", "nest:120"),
    "enum of 100,000 strings": ("json", "enum:100000"),
    "20,000 properties": ("json", "props:20000"),
    "anyOf of 5,000 objects": ("json", "anyof:5000"),
    "regex a{1000000}": ("regex", "a{1000000}"),
    "regex ((a{1000}){1000})": ("regex", "((a{1000}){1000})"),
    "pattern (a|b)*a(a|b){25}": ("json", "pattern"),
    "string minLength 5,000,000": ("json", "minlen"),
    "grammar that never ends": ("lark", 'start: "a" start'),
    "invalid schema (type foo)": ("json", "bad"),
}


def pathological_source(kind: str, spec: str) -> Any:
    if kind != "json":
        return spec
    if spec.startswith("nest:"):
        s: dict[str, Any] = {"type": "string"}
        for _ in range(int(spec[5:])):
            s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
        return s
    if spec.startswith("enum:"):
        return {"type": "string", "enum": [f"value_{i}" for i in range(int(spec[5:]))]}
    if spec.startswith("props:"):
        n = int(spec[6:])
        return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
    if spec.startswith("anyof:"):
        n = int(spec[6:])
        return {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {f"k{i}": {"type": "string"}},
                    "required": [f"k{i}"],
                }
                for i in range(n)
            ]
        }
    if spec == "pattern":
        return {"type": "string", "pattern": "^(a|b)*a(a|b){25}$"}
    if spec == "minlen":
        return {"type": "string", "minLength": 5_000_000}
    return {"type": "foo"}


# ---------------------------------------------------------------------------- the vocabulary
def load_vocabulary(model: str) -> tuple[Any, Any]:
    """(the token table as specdec reads it, a llama.cpp tokenizer for the documents)."""
    import llama_cpp

    from specdec.constraints.tokens import TokenTable
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppTokenizer

    llm = llama_cpp.Llama(str(resolve(model)), vocab_only=True, verbose=False)
    tok = LlamaCppTokenizer(llm)
    n = int(llama_cpp.llama_vocab_n_tokens(tok.vocab))
    pieces, special = tok.token_pieces(n)
    eos = tuple(sorted({int(llm.token_eos()), 151643} & set(range(n))))
    table = TokenTable(
        tuple(pieces), special | frozenset(eos), eos, lambda t: tok.encode_piece(t, special=False)
    )
    return table, tok


# ---------------------------------------------------------------------------- engine adapters
class Adapter:
    """One engine behind the same calls: setup, compile, mask, consume, rollback, fork."""

    name = ""

    def setup(self, table: Any) -> None: ...
    def compile(self, workload: str) -> Any: ...
    def mask(self, m: Any, words: Any) -> None: ...
    def consume(self, m: Any, tok: int) -> bool: ...
    def rollback(self, m: Any, n: int) -> None: ...
    def fork(self, m: Any) -> Any: ...
    def legal(self, m: Any, toks: list[int]) -> int: ...


class Llguidance(Adapter):
    name = "llguidance"
    options: dict[str, Any] | None = None  # the engine's JSON defaults (flexible whitespace)

    def setup(self, table: Any) -> None:
        from specdec.constraints.engine import vocabulary

        self.vocab = vocabulary(table)
        self.eos = set(table.eos)

    def compile(self, workload: str) -> Any:
        import llguidance

        schema = INVOICE_SCHEMA if workload == "invoice" else {"type": "object"}
        g = llguidance.LLMatcher.grammar_from_json_schema(schema, self.options)
        m = llguidance.LLMatcher(self.vocab, g, log_level=0)
        assert not m.is_error(), m.get_error()
        return m

    def mask(self, m: Any, words: Any) -> None:
        m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def consume(self, m: Any, tok: int) -> bool:
        if tok in self.eos:  # EOS is not part of the matcher's history
            return bool(m.is_accepting())
        return bool(m.consume_token(tok))

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)

    def fork(self, m: Any) -> Any:
        return m.deep_copy()

    def legal(self, m: Any, toks: list[int]) -> int:
        return int(m.validate_tokens(toks))


class LlguidanceSpecdec(Llguidance):
    """llguidance with the options specdec uses (whitespace bounded: engine.JSON_WHITESPACE)."""

    name = "llguidance-specdec"

    def setup(self, table: Any) -> None:
        from specdec.constraints.engine import JSON_OPTIONS

        super().setup(table)
        self.options = JSON_OPTIONS


class Xgrammar(Adapter):
    name = "xgrammar"

    def setup(self, table: Any) -> None:
        import xgrammar as xgr

        vocab = [b"" if i in table.special else p for i, p in enumerate(table.pieces)]
        info = xgr.TokenizerInfo(
            vocab, xgr.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=list(table.eos)
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, workload: str) -> Any:
        import xgrammar as xgr

        if workload == "invoice":
            g = self.compiler.compile_json_schema(json.dumps(INVOICE_SCHEMA), any_whitespace=True)
        else:
            g = self.compiler.compile_builtin_json_grammar()
        return xgr.GrammarMatcher(g)

    def mask(self, m: Any, words: Any) -> None:
        import torch

        m.fill_next_token_bitmask(torch.from_numpy(words).view(1, -1))

    def consume(self, m: Any, tok: int) -> bool:
        return bool(m.accept_token(tok))

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)

    def fork(self, m: Any) -> Any:
        return m.fork()

    def legal(self, m: Any, toks: list[int]) -> int:  # no batch check: accept, then roll back
        n = 0
        for t in toks:
            if not m.accept_token(t):
                break
            n += 1
        m.rollback(n)
        return n


class OutlinesCore(Adapter):
    name = "outlines-core"

    def setup(self, table: Any) -> None:
        from outlines_core import Vocabulary

        words: dict[bytes, list[int]] = {}
        for i, p in enumerate(table.pieces):
            if p and i not in table.special:
                words.setdefault(p, []).append(i)
        self.vocabulary = Vocabulary(table.eos[0], words)
        self.eos = set(table.eos)

    def compile(self, workload: str) -> Any:
        from outlines_core import Guide, Index
        from outlines_core.json_schema import build_regex_from_schema

        if workload != "invoice":
            raise NotImplementedError("no recursive grammars (regular languages only)")
        regex = build_regex_from_schema(json.dumps(INVOICE_SCHEMA), r"[\n\t ]*")
        return Guide(Index(regex, self.vocabulary))

    def mask(self, m: Any, words: Any) -> None:
        import torch

        m.write_mask_into(torch.from_numpy(words).data_ptr(), words.size, 4)

    def consume(self, m: Any, tok: int) -> bool:
        if tok in self.eos:
            return bool(m.is_finished())
        m.advance(tok)
        return True

    def rollback(self, m: Any, n: int) -> None:
        m.rollback_state(n)

    def fork(self, m: Any) -> Any:
        raise NotImplementedError("no fork or copy of a Guide")

    def legal(self, m: Any, toks: list[int]) -> int:
        return int(m.accepts_tokens(toks)) * len(toks)  # all-or-nothing


ADAPTERS = {a.name: a for a in (Llguidance(), LlguidanceSpecdec(), Xgrammar(), OutlinesCore())}


# ---------------------------------------------------------------------------- measuring
def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def us(xs: list[float]) -> dict[str, float]:
    return {
        "mean_us": 1e6 * statistics.fmean(xs),
        "p50_us": 1e6 * percentile(xs, 0.5),
        "p90_us": 1e6 * percentile(xs, 0.9),
        "p99_us": 1e6 * percentile(xs, 0.99),
        "max_us": 1e6 * max(xs),
    }


def walk(a: Adapter, m: Any, ids: list[int], words: Any) -> tuple[list[float], list[float]]:
    """Mask and consume every token of ``ids``; (mask seconds, consume seconds) per token."""
    masks, consumes = [], []
    for tok in ids:
        t0 = time.perf_counter()
        a.mask(m, words)
        t1 = time.perf_counter()
        assert (int(words[tok // 32]) >> (tok % 32)) & 1, f"{a.name}: token {tok} masked out"
        ok = a.consume(m, tok)
        t2 = time.perf_counter()
        assert ok, f"{a.name}: token {tok} refused"
        masks.append(t1 - t0)
        consumes.append(t2 - t1)
    return masks, consumes


def measure_engine(name: str, model: str, walks: int) -> dict[str, Any]:
    import numpy as np

    a = ADAPTERS[name]
    table, tok = load_vocabulary(model)
    words = np.zeros((table.vocab_size + 31) // 32, dtype=np.int32)
    t0 = time.perf_counter()
    a.setup(table)
    out: dict[str, Any] = {"engine": name, "setup_s": time.perf_counter() - t0}
    doc = json.dumps(INVOICE, indent=2, ensure_ascii=False)
    ids = tok.encode_piece(doc, special=False)
    out["document_tokens"] = len(ids)
    for workload in ("invoice", "any-json"):
        rec: dict[str, Any] = {}
        try:
            t0 = time.perf_counter()
            m = a.compile(workload)
            rec["compile_s"] = time.perf_counter() - t0
        except NotImplementedError as e:
            out[workload] = {"unsupported": str(e)}
            continue
        path = [*ids, table.eos[0]]
        first, _first_consume = walk(a, m, path, words)
        rec["first_walk"] = {"total_ms": 1e3 * sum(first), **us(first)}
        warm: list[float] = []
        consume: list[float] = []
        for _ in range(walks):
            m = a.compile(workload)
            w, c = walk(a, m, path, words)
            warm += w
            consume += c
        rec["mask"] = us(warm)
        rec["consume"] = us(consume)
        m = a.compile(workload)
        walk(a, m, ids[:200], words)
        t0 = time.perf_counter()
        a.rollback(m, 16)
        rec["rollback_16_us"] = 1e6 * (time.perf_counter() - t0)
        walk(a, m, ids[184:200], words)  # the same 16 tokens again
        t0 = time.perf_counter()
        legal = a.legal(m, ids[200:216])
        rec["legal_16"] = {"us": 1e6 * (time.perf_counter() - t0), "legal": legal}
        try:
            t0 = time.perf_counter()
            a.fork(m)
            rec["fork_us"] = 1e6 * (time.perf_counter() - t0)
        except NotImplementedError as e:
            rec["fork_us"] = None
            rec["fork"] = str(e)
        out[workload] = rec
    out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def measure_pathological(name: str, model: str, case: str) -> dict[str, Any]:
    """One pathological input on a fresh engine: compile + first mask, what it said."""
    import numpy as np

    kind, spec = PATHOLOGICAL[case]
    source = pathological_source(kind, spec)
    table, _ = load_vocabulary(model)
    a = ADAPTERS[name]
    a.setup(table)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    words = np.zeros((table.vocab_size + 31) // 32, dtype=np.int32)
    t0 = time.perf_counter()
    said = "ok"
    try:
        m = compile_pathological(name, a, kind, source)
        if m is not None:
            a.mask(m, words)
            if name.startswith("llguidance") and m.is_error():
                said = m.get_error().split("\n")[0][:160]
    except Exception as e:
        said = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return {
        "seconds": time.perf_counter() - t0,
        "extra_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
        "said": said,
    }


def compile_pathological(name: str, a: Any, kind: str, source: Any) -> Any:
    if name.startswith("llguidance"):
        import llguidance

        from specdec.constraints.engine import LIMITS

        f = {
            "json": lambda s: llguidance.LLMatcher.grammar_from_json_schema(s, a.options),
            "regex": llguidance.LLMatcher.grammar_from_regex,
            "lark": llguidance.LLMatcher.grammar_from_lark,
        }[kind]
        limits = llguidance.LLParserLimits(**LIMITS) if name == "llguidance-specdec" else None
        return llguidance.LLMatcher(a.vocab, f(source), log_level=0, limits=limits)
    if name == "xgrammar":
        import xgrammar as xgr

        if kind == "json":
            g = a.compiler.compile_json_schema(json.dumps(source), any_whitespace=True)
        elif kind == "regex":
            g = a.compiler.compile_regex(source)
        else:
            g = a.compiler.compile_grammar('root ::= "a" root')
        return xgr.GrammarMatcher(g)
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    if kind == "lark":
        raise NotImplementedError("no grammars beyond regular expressions")
    regex = build_regex_from_schema(json.dumps(source)) if kind == "json" else source
    return Guide(Index(regex, a.vocabulary))


def mask_apply_cost(vocab: int, repeats: int = 2000) -> dict[str, float]:
    """Seconds to turn a bitmask into -inf on one float32 row (constraints.processor's way)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    words = rng.integers(-(2**31), 2**31, size=(vocab + 31) // 32, dtype=np.int64).astype(np.int32)
    row = torch.randn(vocab)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
        allowed = torch.from_numpy(bits.view(np.bool_))
        out = row.clone()
        out.masked_fill_(~allowed, float("-inf"))
        times.append(time.perf_counter() - t0)
    return us(times)


def child(args: argparse.Namespace) -> int:
    if args.case:
        res = measure_pathological(args.engine, args.model, args.case)
    else:
        res = measure_engine(args.engine, args.model, args.walks)
    print(json.dumps(res))
    return 0


def run_child(argv: list[str], timeout: float) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, __file__, *argv], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"timeout_s": timeout}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"failed": tail[0][:200], "returncode": done.returncode}
    return dict(json.loads(lines[-1]))


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for pkg in ("llguidance", "xgrammar", "outlines-core", "llama-cpp-python", "torch"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def table_lines(res: dict[str, Any]) -> list[str]:
    lines = [
        "| engine | setup s | compile ms | first walk ms | mask mean / p99 / max us "
        "| rollback 16 us | fork us | any-JSON mask mean / p99 us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in res["engines"].items():
        inv, anyj = r.get("invoice", {}), r.get("any-json", {})
        if "failed" in r or "mask" not in inv:
            lines.append(f"| {name} | {r} |")
            continue
        fork = "n/a" if inv.get("fork_us") is None else f"{inv['fork_us']:.0f}"
        aj = (
            f"{anyj['mask']['mean_us']:.0f} / {anyj['mask']['p99_us']:.0f}"
            if "mask" in anyj
            else "unsupported"
        )
        lines.append(
            f"| {name} | {r['setup_s']:.2f} | {1e3 * inv['compile_s']:.1f} | "
            f"{inv['first_walk']['total_ms']:.1f} | {inv['mask']['mean_us']:.0f} / "
            f"{inv['mask']['p99_us']:.0f} / {inv['mask']['max_us']:.0f} | "
            f"{inv['rollback_16_us']:.0f} | {fork} | {aj} |"
        )
    lines.append("")
    lines.append("| pathological input | " + " | ".join(res["engines"]) + " |")
    lines.append("|---|" + "---|" * len(res["engines"]))
    for case in PATHOLOGICAL:
        cells = []
        for name in res["engines"]:
            p = res["pathological"][name][case]
            if "seconds" in p:
                cells.append(f"{p['seconds']:.2f} s, +{p['extra_rss_mb']:.0f} MB: {p['said']}")
            else:
                cells.append(str(p))
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--walks", type=int, default=5)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        return child(args)
    from specdec.util.machine import machine_line

    engines = args.engines.split(",")
    res: dict[str, Any] = {
        "machine": machine_line(),
        "model": args.model,
        "versions": versions(),
        "engines": {},
        "pathological": {},
        "mask_apply": mask_apply_cost(151936),
    }
    for name in engines:
        print(f"[grammar-engines] {name} ...", file=sys.stderr)
        res["engines"][name] = run_child(
            ["--engine", name, "--model", args.model, "--walks", str(args.walks)], 900
        )
        res["pathological"][name] = {
            case: run_child(["--engine", name, "--model", args.model, "--case", case], 60)
            for case in PATHOLOGICAL
        }
    text = "\n".join([f"machine: {res['machine']}", f"versions: {res['versions']}", ""])
    text += "\n".join(table_lines(res))
    text += (
        f"\n\nmask applied to one row of 151,936 float32 logits (unpackbits + masked_fill): "
        f"mean {res['mask_apply']['mean_us']:.0f} us, p99 {res['mask_apply']['p99_us']:.0f} us\n"
    )
    print(text)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
