"""The plain baselines side by side, interleaved in one process on the same GGUF:

  A  llama-cpp-python's own decoding loop (``Llama.create_completion``, greedy, streamed so
     that prefill and decode can be told apart)
  B  specdec's llama.cpp backend with K = 0 (``specdec generate -k 0 --target-backend llamacpp``)
  C  optional: specdec with a drafter on the same backend (``--draft``, e.g. ngram)

Per prompt and repeat each decoder runs once, in a rotating order, so slow drift hits them
alike; the script prints decode tokens/s, prefill seconds and the ratios B/A (and C/A) per
prompt, and their geometric means. Greedy, the same thread count for all.

    python benchmarks/plain_baselines.py --prompts 6 --new-tokens 64 --repeats 2 [--draft ngram]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path


def llama_cpp_own(llm, prompt_ids: list[int], n_new: int) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """(prefill seconds, decode seconds, tokens) of llama-cpp-python's own greedy loop."""
    llm.reset()
    t0 = time.perf_counter()
    t_first = None
    n = 0
    for _ in llm.create_completion(
        prompt_ids, max_tokens=n_new, temperature=0.0, top_k=1, stream=True
    ):
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    assert t_first is not None
    return t_first - t0, t_end - t_first, n - 1  # decode rate from the 2nd token on


def specdec_run(
    target, draft, prompt_ids: list[int], n_new: int, k: int
) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    from specdec.decoding import generate

    res = generate(target, draft, prompt_ids, max_new_tokens=n_new, k=k, reuse_prefix=False)
    first = res.rounds[0].t_round if res.rounds else 0.0
    decode = res.t_total - res.t_prefill - first
    return res.t_prefill + first, decode, len(res.tokens) - res.rounds[0].n_emitted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--prompts", type=int, default=6, help="one per Spec-Bench category, up to")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft", default=None, help="also run specdec with this drafter (C)")
    ap.add_argument("-k", type=int, default=8, help="K for the drafter run")
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = ap.parse_args()

    import llama_cpp

    from specdec.bench.prompts import select_prompts
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.pairs import parse_drafter
    from specdec.prompting import encode_prompt

    path = resolve(args.model)
    ours = LlamaCppLM(path, n_ctx=4096, n_threads=args.threads)
    own = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=4096,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=128,
        verbose=False,
    )
    drafter = parse_drafter(args.draft) if args.draft else None
    prompts = select_prompts(None, per_category=1)[: args.prompts]
    ids = {p.id: encode_prompt(ours, p.text, chat=True) for p in prompts}

    runners = {
        "llama-cpp-python": lambda p: llama_cpp_own(own, p, args.new_tokens),
        "specdec plain": lambda p: specdec_run(ours, None, p, args.new_tokens, 0),
    }
    if drafter is not None:
        runners[f"specdec {args.draft} K={args.k}"] = lambda p: specdec_run(
            ours, drafter, p, args.new_tokens, args.k
        )
    names = list(runners)
    first = next(iter(ids.values()))
    for r in runners.values():  # warm-up
        r(first[:32])
    rows: dict[str, dict[str, list[tuple[float, float, int]]]] = {
        p.id: {n: [] for n in names} for p in prompts
    }
    for rep in range(args.repeats):
        for i, p in enumerate(prompts):
            order = names[(rep + i) % len(names) :] + names[: (rep + i) % len(names)]
            for name in order:
                rows[p.id][name].append(runners[name](ids[p.id]))
    base = names[0]
    print(f"{'prompt':28} {'tokens in':>9} " + " ".join(f"{n[:22]:>24}" for n in names))
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for p in prompts:
        tps = {n: statistics.median(t / d for _, d, t in rows[p.id][n] if d > 0) for n in names}
        cells = [f"{tps[base]:7.2f} tok/s"]
        for n in names[1:]:
            ratios[n].append(tps[n] / tps[base])
            cells.append(f"{tps[n]:7.2f} ({tps[n] / tps[base]:.3f}x)")
        print(f"{p.id[:28]:28} {len(ids[p.id]):>9} " + " ".join(f"{c:>24}" for c in cells))
    for n, r in ratios.items():
        gm = math.exp(sum(math.log(x) for x in r) / len(r))
        print(f"geometric mean, {n} / {base}: {gm:.3f}x (decode tokens/s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"prompts": {p.id: rows[p.id] for p in prompts}, "args": vars(args)}, default=str
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
