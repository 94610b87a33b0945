"""Greedy output of speculative decoding against plain decoding, token for token, on the
default target: does every configuration give plain decoding's exact tokens?

One process, one numerics (``--numerics exact``: the target with ``exact=True``;
``default``: llama.cpp's default settings; ``auto``: what specdec chooses with no flag,
``configuration.default_numerics``: exact where they cost at most 3 % on this machine and
build, measured once and cached). Per prompt (128 new tokens, the chat template):

  plain              specdec with K = 0 (a fresh prefill of the prompt)
  planned            the default drafter (cost-aware suffix drafts; the target's costs
                     measured once for these numerics and cached)
  suffix16           suffix drafts up to 16 tokens (verify passes of up to 17 rows)
  draft-model        the 0.5B draft model, K = 6, on llama.cpp's default numerics (a draft
                     only proposes; its numerics cannot change the output)
  llama-cpp-python   llama-cpp-python's own loop (``Llama.generate``, greedy) on a second
                     instance with the same settings and n_batch 512 (specdec's is 128), so its
                     prompt is split into other passes

  prediction         (prompts with a prediction only) the prompt's prediction drafted in front
                     of the planned drafter, as ``Pair.generate(prediction=...)`` does

specdec's configurations after plain reuse the target's cached prompt. Prompts: the
``--long`` longest Spec-Bench questions (all over 600 tokens in the template), two per
coarse category of the rest (``--per-category``), 4 code-editing (``--code-edits``) and 2
HumanEval prompts, and 4 code edits of the
code_predict set with their predictions (a rename, a small edit, a whole-file rewrite and
an unrelated prediction). Each prompt's record is appended to
``--out`` (JSONL) as it completes; ``--resume`` skips the prompts already there. The summary
prints, per configuration, on how many prompts the tokens equal plain decoding's and, where
not, the first differing token.

    PYTHONPATH=src python benchmarks/exact_greedy.py --numerics exact \
        --out benchmarks/results/exact-greedy-exact.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
LONG = 600  # prompt tokens that make a prompt "long" for the done-when of issue 26
# code edits with the code as the prediction (the code_predict set), one of each kind; the
# unrelated control drafts a wrong prediction wherever it rejoins
PREDICTION_KINDS = ("rename", "small_edit", "whole_file", "control_unrelated")


def choose_prompts(
    target: Any, n_long: int, per_category: int, n_code: int = 4
) -> list[tuple[Any, list[int]]]:
    from specdec.prompt_sets import (
        load_code_completion,
        load_code_edit,
        load_code_predict,
        load_spec_bench,
        sample_per_category,
    )
    from specdec.prompting import encode_prompt

    spec = load_spec_bench()
    ids = {p.id: encode_prompt(target, p.text, chat=True) for p in spec}
    by_length = sorted(spec, key=lambda p: -len(ids[p.id]))
    longest = by_length[:n_long]
    rest = [p for p in spec if p not in longest]
    chosen = longest + sample_per_category(rest, per_category, seed=0)
    chosen += load_code_edit()[:n_code] + load_code_completion()[:2]
    by_kind = {p.fine_category: p for p in reversed(load_code_predict())}  # first of each kind
    chosen += [by_kind[k] for k in PREDICTION_KINDS]
    return [(p, ids.get(p.id) or encode_prompt(target, p.text, chat=True)) for p in chosen]


def run_prompt(
    target: Any,
    other: Any,
    drafters: dict[str, tuple[Any, int]],
    ids: list[int],
    n_new: int,
) -> dict[str, Any]:
    from specdec.certify.common import first_difference
    from specdec.core.loop import generate

    runs: dict[str, dict[str, Any]] = {}
    target.truncate(0)
    t0 = time.perf_counter()
    plain = generate(target, None, ids, max_new_tokens=n_new, k=0, reuse_prefix=False)
    runs["plain"] = {"tokens": plain.tokens, "seconds": time.perf_counter() - t0}
    for name, (drafter, k) in drafters.items():
        t0 = time.perf_counter()
        res = generate(target, drafter, ids, max_new_tokens=n_new, k=k)
        passes = [r.k + 1 for r in res.rounds if r.k > 0]
        runs[name] = {
            "tokens": res.tokens,
            "seconds": time.perf_counter() - t0,
            "multi_token_passes": len(passes),
            "largest_pass": max(passes, default=1),
            "tokens_per_round": res.mean_tokens_per_round,
        }
    t0 = time.perf_counter()
    own: list[int] = []
    llm = other.llm
    for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        own.append(int(tok))
        if len(own) == len(plain.tokens) or int(tok) in other.eos_token_ids:
            break
    runs["llama-cpp-python"] = {"tokens": own, "seconds": time.perf_counter() - t0}
    for r in runs.values():
        r["first_difference"] = first_difference(r["tokens"], plain.tokens)
        r["identical"] = r["tokens"] == plain.tokens
    return runs


def summary(records: list[dict[str, Any]]) -> str:
    names = list(dict.fromkeys(n for r in records for n in r["runs"]))
    n_long = sum(r["prompt_tokens"] > LONG for r in records)
    lines = [
        f"{len(records)} prompts ({n_long} over {LONG} tokens), "
        f"{sum(len(r['runs']['plain']['tokens']) for r in records)} plain tokens; numerics: "
        f"{records[0]['numerics'] if records else '?'}",
        "",
        "| configuration | identical to plain | multi-token passes | largest pass | "
        "first differences (prompt: token) |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        ran = [r for r in records if name in r["runs"]]  # a prediction: its prompts only
        same = sum(r["runs"][name]["identical"] for r in ran)
        multi = sum(r["runs"][name].get("multi_token_passes", 0) for r in ran)
        largest = max((r["runs"][name].get("largest_pass", 1) for r in ran), default=1)
        diffs = [
            f"{r['id']}: {r['runs'][name]['first_difference']}"
            for r in ran
            if not r["runs"][name]["identical"]
        ]
        lines.append(
            f"| {name} | {same}/{len(ran)} | {multi if name != 'plain' else '-'} | "
            f"{largest if name not in ('plain', 'llama-cpp-python') else 1} | "
            f"{'; '.join(diffs) or '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--numerics", choices=("exact", "default", "auto"), required=True)
    ap.add_argument("--out", type=Path, required=True, help="JSONL, one record per prompt")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--summary", action="store_true", help="only print the summary of --out")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--long", type=int, default=12, help="the longest Spec-Bench prompts")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--code-edits", type=int, default=4, help="prompts of the code_edit set")
    args = ap.parse_args(argv)
    if args.summary:
        records = [json.loads(x) for x in args.out.read_text().splitlines() if x.strip()]
        print(summary(records))
        return 0
    if args.out.exists() and not args.resume:
        sys.exit(f"{args.out} exists: --resume to continue it, or remove it")
    exact = args.numerics == "exact"
    if args.numerics == "auto":
        from specdec.configuration import default_numerics
        from specdec.pairs import ModelOptions

        options = ModelOptions(n_threads=args.threads)
        exact = default_numerics(TARGET, options, log=lambda m: print(m, file=sys.stderr))
    if exact:  # ggml reads it once per process, at the first K-quant product
        os.environ.setdefault("GGML_CPU_TILED_MM", "0")

    from specdec.drafters.planned import PlannedSuffixDrafter
    from specdec.drafters.prediction import PredictionDrafter
    from specdec.drafters.suffix import SuffixDrafter
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.models.loader import ModelConfig
    from specdec.pairs import PLANNED_K
    from specdec.profiler.target_costs import cached_target_costs

    path = resolve(TARGET)
    target = LlamaCppLM(path, n_ctx=4096, n_threads=args.threads, exact=exact)
    other = LlamaCppLM(path, n_ctx=4096, n_threads=args.threads, n_batch=512, exact=exact)
    draft = LlamaCppLM(resolve(DRAFT), n_ctx=4096, n_threads=args.threads)
    cfg = ModelConfig(TARGET, "llamacpp", n_ctx=4096, n_threads=args.threads, exact=exact)
    costs = cached_target_costs(cfg, target, log=lambda m: print(m, file=sys.stderr))
    drafters = {
        "planned": (PlannedSuffixDrafter(SuffixDrafter(), costs), PLANNED_K),
        "suffix16": (SuffixDrafter(), 16),
        "draft-model": (draft, 6),
    }
    done = set()
    if args.out.exists():
        done = {json.loads(x)["id"] for x in args.out.read_text().splitlines() if x.strip()}
    prompts = choose_prompts(target, args.long, args.per_category, args.code_edits)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for prompt, ids in prompts:
        if prompt.id in done:
            continue
        t0 = time.perf_counter()
        these = dict(drafters)
        if prompt.prediction is not None:  # drafted from the prediction, else planned
            predicted = target.tokenizer.encode(prompt.prediction, add_special_tokens=False)
            fallback = PlannedSuffixDrafter(SuffixDrafter(), costs)
            these["prediction"] = (
                PredictionDrafter(predicted, costs=costs, fallback=fallback),
                PLANNED_K,
            )
        runs = run_prompt(target, other, these, ids, args.new_tokens)
        rec = {
            "id": prompt.id,
            "category": prompt.category,
            "prompt_tokens": len(ids),
            "numerics": args.numerics,
            "exact": exact,
            "threads": args.threads,
            # which optional kernels the target kept (llama_trust.exact_kernels) and which build
            "kernels": target.kernel_choice.text(),
            "lib_path": os.environ.get("LLAMA_CPP_LIB_PATH"),
            "runs": runs,
        }
        with args.out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        same = "".join("=" if r["identical"] else "x" for r in runs.values())
        print(
            f"{prompt.id} ({len(ids)} tokens) {same} {time.perf_counter() - t0:.0f} s", flush=True
        )
    records = [json.loads(x) for x in args.out.read_text().splitlines() if x.strip()]
    print(summary(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
