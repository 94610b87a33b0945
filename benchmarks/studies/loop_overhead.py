"""What each plain decoding loop spends outside llama.cpp: specdec's (``generate`` with K = 0
on the llama.cpp backend) against llama-cpp-python's own (``create_completion``, greedy,
streamed), on one ``Llama`` instance, so that the weights in memory are the same.

Every ``llama_decode`` call is timed (the function is wrapped where both loops look it up);
a run's time outside those calls is its loop's own work: building batches, copying logits,
argmax, detokenizing, bookkeeping. Both loops run one pass per generated token, so the
difference per token is what one loop costs over the other, independent of how fast the
machine decodes at that moment (the passes themselves are what varies from run to run).

    python benchmarks/studies/loop_overhead.py --per-category 1 --new-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--source", default="spec_bench")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import llama_cpp
    import llama_cpp.llama_cpp as low

    from specdec.core.loop import generate
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.prompt_sets import select_prompts
    from specdec.prompting import encode_prompt

    in_decode = {"s": 0.0, "calls": 0}
    call_s: list[float] = []  # every llama_decode call's seconds (the median is a decode pass)
    original = low.llama_decode

    def timed_decode(ctx: Any, batch: Any) -> int:
        t0 = time.perf_counter()
        code = original(ctx, batch)
        in_decode["s"] += time.perf_counter() - t0
        in_decode["calls"] += 1
        call_s.append(time.perf_counter() - t0)
        return int(code)

    # llama-cpp-python's loop calls llama_cpp.llama_cpp.llama_decode, specdec's the name
    # re-exported by the package
    low.llama_decode = timed_decode
    llama_cpp.llama_decode = timed_decode

    lm = LlamaCppLM(resolve(args.model), n_ctx=4096, n_threads=args.threads)
    prompts = select_prompts(args.source, per_category=args.per_category)
    ids = [encode_prompt(lm, p.text, chat=True) for p in prompts]

    def specdec_plain(prompt: list[int]) -> int:
        res = generate(lm, None, prompt, max_new_tokens=args.new_tokens, k=0, reuse_prefix=False)
        return len(res.tokens)

    def llama_cpp_python(prompt: list[int]) -> int:
        lm.truncate(0)
        n = 0
        for _ in lm.llm.create_completion(
            prompt, max_tokens=args.new_tokens, temperature=0.0, top_k=1, stream=True
        ):
            n += 1
        lm.llm.reset()
        lm.truncate(0)
        return n

    loops: dict[str, Callable[[list[int]], int]] = {
        "specdec plain": specdec_plain,
        "llama-cpp-python": llama_cpp_python,
    }
    for run in loops.values():  # warm-up
        run(ids[0][:16])
    call_s.clear()
    # per loop: (seconds outside llama_decode, llama_decode calls, seconds inside)
    rows: dict[str, list[tuple[float, int, float]]] = {name: [] for name in loops}
    for rep in range(args.repeats):
        for i, prompt in enumerate(ids):
            order = list(loops) if (rep + i) % 2 == 0 else list(loops)[::-1]
            for name in order:
                in_decode.update(s=0.0, calls=0)
                t0 = time.perf_counter()
                loops[name](prompt)
                total = time.perf_counter() - t0
                rows[name].append((total - in_decode["s"], int(in_decode["calls"]), in_decode["s"]))
    print(
        f"{len(ids)} prompts x {args.repeats} repeats, {args.new_tokens} new tokens, "
        f"{args.threads} threads, one Llama instance"
    )
    print(f"{'loop':18} {'outside llama_decode, per call':>32} {'inside, per call':>18}")
    print("(inside includes each run's prefill call; a decode pass is the median call below)")
    per_call_out = {}
    per_call_in = {}
    for name, rs in rows.items():
        per_call_out[name] = statistics.median(o / c for o, c, _ in rs)
        per_call_in[name] = statistics.median(i / c for _, c, i in rs)
        print(f"{name:18} {per_call_out[name] * 1e3:29.2f} ms {per_call_in[name] * 1e3:15.1f} ms")
    extra = per_call_out["specdec plain"] - per_call_out["llama-cpp-python"]
    step = statistics.median(call_s)
    print(
        f"specdec's loop costs {extra * 1e3:+.2f} ms per pass over llama-cpp-python's, "
        f"{extra / step:+.2%} of a decode pass (median llama_decode call {step * 1e3:.1f} ms; "
        "medians over runs of per-call means)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
