"""Structured outputs on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft, Q4_K_M
GGUFs, llama.cpp backend, default options: exact numerics on): three parts, each printed as
measured in this one run.

  identity  greedy output under each of 10 JSON schemas with speculation on (the 0.5B draft
            model, K = 4, its rows masked too, so that every output is drafted: the default
            suffix drafter drafts nothing on short answers, and an output without drafts
            proves nothing) and with K = 0 (plain decoding, the same target): identical or not,
            and how many outputs had drafts.
  cost      decode speed with a schema against the same request without one, where both give
            the same tokens (a prompt whose free greedy output already is an instance), the
            pair's default K both times; runs interleaved, medians of ``--repeats``.
  edit      a JSON document edited (one field changed), the document as the prediction,
            under the document's schema, against plain llama.cpp on the same GGUF
            (llama-cpp-python's own greedy loop on the same ``Llama`` object, unconstrained:
            ``bench.llama_own``), decode window only (prefill and first token excluded);
            medians of ``--repeats``; the outputs are compared.

    PYTHONPATH=src /work/bin/cpu-quiet python benchmarks/structured_speed.py \\
        --part identity --out benchmarks/results/structured-identity.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}},
        "required": ["sentiment"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3},
    {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "language": {"type": "string"},
            "year": {"type": "integer"},
            "typed": {"type": "boolean"},
        },
        "required": ["language", "year", "typed"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"steps": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
        "required": ["steps"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "function": {"type": "string"},
            "args": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["function", "args"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string"}},
        "required": ["ok", "reason"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["date"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
]
PROMPTS = [
    "Describe Ada Lovelace as JSON with her name and age at death.",
    "Classify the sentiment of: 'The build finally passes.' Answer in JSON.",
    "List three Python web frameworks as a JSON array.",
    "Give the coordinates of the point (3.5, -2) as JSON.",
    "Describe the Rust programming language as JSON (language, year, typed).",
    "Give the steps to make tea as JSON.",
    "Write a call of print with two arguments as JSON.",
    "Is 17 prime? Answer as JSON with ok and reason.",
    "Give the date of the first moon landing as JSON.",
    "An order of 2 apples (sku A1) and 5 pears (sku P9) as JSON.",
]

DOCUMENT = {
    "service": "billing",
    "version": 3,
    "owners": ["ana@example.com", "li@example.com"],
    "endpoints": [
        {"path": "/invoices", "method": "GET", "timeout_ms": 1500, "auth": True},
        {"path": "/invoices", "method": "POST", "timeout_ms": 3000, "auth": True},
        {"path": "/invoices/{id}", "method": "GET", "timeout_ms": 1500, "auth": True},
        {"path": "/invoices/{id}/pdf", "method": "GET", "timeout_ms": 8000, "auth": True},
        {"path": "/health", "method": "GET", "timeout_ms": 200, "auth": False},
    ],
    "limits": {"requests_per_minute": 600, "burst": 50, "max_body_kb": 256},
    "features": {"dunning": True, "multi_currency": False, "tax_engine": "v2"},
}
DOC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "service": {"type": "string"},
        "version": {"type": "integer"},
        "owners": {"type": "array", "items": {"type": "string"}},
        "endpoints": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "method": {"enum": ["GET", "POST"]},
                    "timeout_ms": {"type": "integer"},
                    "auth": {"type": "boolean"},
                },
                "required": ["path", "method", "timeout_ms", "auth"],
                "additionalProperties": False,
            },
        },
        "limits": {
            "type": "object",
            "properties": {
                "requests_per_minute": {"type": "integer"},
                "burst": {"type": "integer"},
                "max_body_kb": {"type": "integer"},
            },
            "required": ["requests_per_minute", "burst", "max_body_kb"],
            "additionalProperties": False,
        },
        "features": {
            "type": "object",
            "properties": {
                "dunning": {"type": "boolean"},
                "multi_currency": {"type": "boolean"},
                "tax_engine": {"type": "string"},
            },
            "required": ["dunning", "multi_currency", "tax_engine"],
            "additionalProperties": False,
        },
    },
    "required": ["service", "version", "owners", "endpoints", "limits", "features"],
    "additionalProperties": False,
}


def identity(pair: Any, max_new: int, k: int | None) -> dict[str, Any]:
    rows = []
    for prompt, schema in zip(PROMPTS, SCHEMAS, strict=True):
        spec = pair.generate(prompt, json_schema=schema, max_new_tokens=max_new, k=k)
        plain = pair.generate(prompt, json_schema=schema, max_new_tokens=max_new, k=0)
        same = spec.result.tokens == plain.result.tokens
        try:
            json.loads(spec.text)
            parsed = True
        except ValueError:
            parsed = False
        rows.append(
            {
                "prompt": prompt,
                "identical": same,
                "tokens": len(spec.result.tokens),
                "finish_reason": spec.result.finish_reason,
                "json_parses": parsed,
                "accepted": spec.result.accepted_tokens,
                "drafted": spec.result.drafted_tokens,
                "text": spec.text,
            }
        )
        print(f"[identity] {same} {len(spec.result.tokens)} tok {spec.text[:60]!r}", flush=True)
    drafted = [r for r in rows if r["drafted"] > 0]  # an output without drafts proves nothing
    return {
        "schemas": len(rows),
        "identical": sum(r["identical"] for r in rows),
        "with_drafts": len(drafted),
        "identical_with_drafts": sum(r["identical"] for r in drafted),
        "rows": rows,
    }


def edit_messages() -> tuple[list[dict[str, str]], str, dict[str, Any]]:
    text = json.dumps(DOCUMENT, indent=2)
    edited = json.loads(text)
    edited["limits"]["burst"] = 80
    messages = [
        {"role": "system", "content": "You edit JSON files. Reply with the whole file only."},
        {
            "role": "user",
            "content": f"Set limits.burst to 80 in this file:\n\n{text}",
        },
    ]
    return messages, text, edited


def cost(pair: Any, repeats: int) -> dict[str, Any]:
    """A schema's cost: the same output with and without the schema (the edit's request,
    whose free greedy output is the edited document)."""
    messages, _, _ = edit_messages()
    n = 400
    runs: dict[str, list[float]] = {"free": [], "schema": []}
    outputs: dict[str, list[int]] = {}
    for _ in range(repeats):
        for name in ("free", "schema"):
            schema = DOC_SCHEMA if name == "schema" else None
            c = pair.generate(None, messages=messages, json_schema=schema, max_new_tokens=n)
            res = c.result
            runs[name].append(len(res.tokens) / (res.t_total - res.t_prefill))
            outputs[name] = res.tokens
            print(f"[cost] {name} {runs[name][-1]:.2f} tok/s {len(res.tokens)} tok", flush=True)
    free, schema = statistics.median(runs["free"]), statistics.median(runs["schema"])
    return {
        "same_output": outputs["free"] == outputs["schema"],
        "tokens": len(outputs["schema"]),
        "free_tps": runs["free"],
        "schema_tps": runs["schema"],
        "ratio_schema_over_free": schema / free,
    }


def edit(pair: Any, repeats: int) -> dict[str, Any]:
    from specdec.bench.llama_own import decode_window, own_loop
    from specdec.request import make_request

    messages, text, edited = edit_messages()
    n = 400
    prompt_ids = pair.prompt_ids(make_request(None, messages=messages))
    spec_tps: list[float] = []
    plain_tps: list[float] = []
    spec_tokens: list[int] = []
    plain_ok = None
    for _ in range(repeats):
        c = pair.generate(
            None, messages=messages, json_schema=DOC_SCHEMA, prediction=text, max_new_tokens=n
        )
        k, s = decode_window(c.result)
        spec_tps.append(k / s)
        spec_tokens = c.result.tokens
        own = own_loop(pair.target, prompt_ids, len(spec_tokens))
        assert own is not None
        plain_tps.append(own.tokens_per_second)
        plain_ok = own.same_output(spec_tokens)
        print(f"[edit] spec {spec_tps[-1]:.2f} plain {plain_tps[-1]:.2f} tok/s", flush=True)
    try:
        valid = json.loads(c.text) == edited
    except ValueError:
        valid = False
    return {
        "tokens": len(spec_tokens),
        "output_is_the_edit": valid,
        "plain_llama_cpp_same_output": plain_ok,
        "accepted": c.result.accepted_tokens,
        "drafted": c.result.drafted_tokens,
        "spec_prediction_schema_tps": spec_tps,
        "plain_llama_cpp_tps": plain_tps,
        "ratio_over_plain_llama_cpp": statistics.median(spec_tps) / statistics.median(plain_tps),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("identity", "cost", "edit"), required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--draft",
        default=None,
        help="the drafter (default: the 0.5B draft model, K = 4, for identity, so that every "
        "output is drafted; the machine default for cost and edit)",
    )
    args = ap.parse_args()
    import specdec
    from specdec.util.machine import machine_line

    t0 = time.perf_counter()
    draft = args.draft or (DRAFT_MODEL if args.part == "identity" else "default")
    k = 4 if draft == DRAFT_MODEL else None
    pair = specdec.load(draft=draft)
    print(f"[structured] loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    res: dict[str, Any] = {"machine": machine_line(), "part": args.part, "pair": draft, "k": k}
    if args.part == "identity":
        res.update(identity(pair, args.max_new_tokens, k))
    elif args.part == "cost":
        res.update(cost(pair, args.repeats))
    else:
        res.update(edit(pair, args.repeats))
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
