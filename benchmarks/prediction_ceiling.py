"""Predicted outputs against the verify curve's ceiling, llama-cpp-python's own loop and the
drafter with its old cap, interleaved in one process on the same GGUF (issue 41's benchmark).

For every request of the chosen sets (``code_predict``: 43 code edits with the code as the
prediction; ``long_edit``: 12 edits of a page of prose or code, the page as the prediction),
these decoders run one after the other, in an order rotated from request to request:

  llama-cpp-python  its own greedy loop (``Llama.create_completion``, streamed) on its own
                    ``Llama`` instance of the same GGUF: the fastest plain decoder of the file
  K<=64             ``Pair.generate(prediction=...)`` as shipped: the prediction drafter in
                    front of the planned suffix drafter, drafts up to 64 tokens
  K<=16             the same code with drafts capped at 16 (``-k 16``, the old cap)
  today             the drafters of commit 5de7d18 (K <= 16; ``baseline_prediction.py``)

The specdec decoders share one llama.cpp instance; each instance prefills a request once
(``--reuse-prompt`` of ``plain_baselines.py``), so the speeds are decode tokens/s after the
first token, the same window for every decoder. Greedy, the same thread count for all.

The verify curve is measured at the start (``profiler.target_costs``, passes of 1..65 rows,
cached for the drafters as ``generate`` caches it) and again at the end; the ceiling of a
request (``specdec.bench.copy_ceiling``) is computed from the K<=64 output, the prediction
and the first curve: the speedup over plain decoding that the curve allows for the
acceptance the output shows against the prediction, at the best K for it. A decoder's
fraction of the ceiling is its decode speed over (ceiling x llama-cpp-python's speed on the
same request). Every table and record carries the machine line (CPU model, cores, flags).

The rule (issue 41, fixed before any run) is printed at the end:
  * the code edits (``code_predict`` without its controls), K<=64: geometric mean of the
    fraction of the ceiling >= 0.90;
  * the same edits: K<=64 faster than K<=16 and than today (geometric means of the
    per-request ratios above 1);
  * no request of any set below llama-cpp-python's speed with K<=64;
  * greedy output unchanged: with ``--exact-check N`` (default 10) the first N code edits
    decode on a second instance with exact numerics (``--exact``), plainly (K = 0) and with
    K<=64: the tokens must be identical, bit for bit, on all N.

Results go to ``--json`` after every request (the file replaced in one step); ``--resume``
keeps the requests it holds (written with the same arguments) and measures the rest;
``--from-json`` prints the report of a saved file.

    PYTHONPATH=src python benchmarks/prediction_ceiling.py --json results/prediction-ceiling.json
    PYTHONPATH=src python benchmarks/prediction_ceiling.py --limit 2 --new-tokens 64 \\
        --exact-check 2 --json /tmp/smoke.json                      # a smoke run, minutes
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RULE_CEILING = 0.90  # code edits, K<=64: geometric mean of speed / ceiling at least this
RULE_FASTER = 1.0  # ... and K<=64 / K<=16, K<=64 / today above this (geometric means)
RULE_FLOOR = 1.0  # no request of K<=64 below this times llama-cpp-python's speed
RULE_EXACT_MIN = 10  # exact numerics: at least this many identical edits
OLD_CAP = 16
NEW_CAP = 64
LLAMA = "llama-cpp-python"
DECODERS = (LLAMA, f"K<={NEW_CAP}", f"K<={OLD_CAP}", "today")
SETS = ("code_predict", "long_edit")
RESUME_KEYS = ("model", "sets", "new_tokens", "threads", "limit", "n_ctx")


def gmean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def is_edit(rec: dict[str, Any]) -> bool:
    return rec["set"] == "code_predict" and not rec["kind"].startswith("control_")


def specdec_tokens(target: Any, drafter: Any, prompt_ids: list[int], n_new: int, k: int) -> dict:
    """One specdec run with the prompt kept: decode seconds and tokens after the first round,
    the output, rounds, rows per pass and the prediction's counts."""
    from specdec.core.loop import generate

    res = generate(target, drafter, prompt_ids, max_new_tokens=n_new, k=k, reuse_prefix=True)
    first = res.rounds[0]
    rounds = res.rounds[1:] or res.rounds
    return {
        "decode_s": res.t_total - res.t_prefill - first.t_round,
        "decode_tokens": len(res.tokens) - first.n_emitted,
        "tokens": res.tokens,
        "rounds": len(res.rounds),
        "rows_per_pass": sum(r.k + 1 for r in rounds) / len(rounds),
        "longest_pass": max(r.k + 1 for r in res.rounds),
        "prediction_tokens": list(res.prediction_tokens()),
    }


def curve_of(costs: Any) -> list[float]:
    v = [float(x) for x in costs.verify_s]
    return [x / v[0] for x in v]


def exact_check(
    path: Path, prompts: list[Any], n: int, n_new: int, threads: int, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The first n code edits on an instance with exact numerics: plain (K = 0) and K<=64
    tokens compared (greedy: identical, bit for bit)."""
    from specdec.core.loop import generate
    from specdec.drafters.planned import PlannedSuffixDrafter, planned_suffix
    from specdec.drafters.prediction import PredictionDrafter
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.models.loader import ModelConfig
    from specdec.pairs import release
    from specdec.profiler.target_costs import cached_target_costs
    from specdec.prompting import encode_prompt, encode_text

    lm = LlamaCppLM(path, n_ctx=4096, n_threads=threads, exact=True)
    cfg = ModelConfig(str(path), "llamacpp", n_ctx=4096, n_threads=threads, exact=True)
    costs = cached_target_costs(cfg, lm, log=log)
    out = []
    for p in prompts[:n]:
        ids = encode_prompt(lm, p.text, chat=True)
        pred = encode_text(lm, p.prediction or "", add_special_tokens=False)
        plain = generate(lm, None, ids, max_new_tokens=n_new, k=0).tokens
        d = PredictionDrafter(
            pred, costs=costs, fallback=PlannedSuffixDrafter(planned_suffix(), costs)
        )
        res = generate(lm, d, ids, max_new_tokens=n_new, k=NEW_CAP)
        same = res.tokens == plain
        passes = max(r.k + 1 for r in res.rounds)
        log(
            f"exact: {p.id}: {'identical' if same else 'DIFFERENT'} ({len(plain)} tokens, "
            f"largest pass {passes} rows)"
        )
        out.append({"id": p.id, "identical": same, "tokens": len(plain), "largest_pass": passes})
    release(lm)
    return out


def _stderr_log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def exact_check_in_child(
    path: Path, prompts: list[Any], n: int, n_new: int, threads: int
) -> list[dict[str, Any]]:
    """``exact_check`` in a fresh process: ggml reads GGML_CPU_TILED_MM once per process, at
    its first K-quant product, so after this process's default-numerics decoders the tiled
    path is on for good and exact numerics' load-time self-check refuses the model (as it
    must: a 9-row pass then differs from one-token passes)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(exact_check, (path, prompts, n, n_new, threads, _stderr_log))


def report(data: dict[str, Any]) -> bool:
    """Print the tables and the rule's verdict; True when the rule is met."""
    machine = data["machine_line"]
    recs = data["requests"]
    print(f"machine: {machine}")
    c0, c1 = data["curve_start"], data.get("curve_end")
    pts = (2, 4, 8, 16, 17, 24, 32, 48, 64, 65)
    print("verify(n)/verify(1) at the start: " + ", ".join(f"{n}: {c0[n - 1]:.2f}" for n in pts))
    if c1:
        drift = max(abs(a / b - 1) for a, b in zip(c0, c1, strict=True))
        print(
            f"  at the end, largest change {drift:.1%}: "
            + ", ".join(f"{n}: {c1[n - 1]:.2f}" for n in pts)
        )
    print(
        f"\n[{machine}] decode tokens/s after the first token; in brackets the ratio to "
        f"{LLAMA}; of ceiling = speed / (ceiling x {LLAMA})"
    )
    print(
        f"{'request':30} {'tokens':>6} {'ceiling':>8} {'alpha':>6} {'K*':>3} {LLAMA[:12]:>12} "
        + " ".join(f"{d:>24}" for d in DECODERS[1:])
        + "  rows/pass(K<=64)"
    )
    for rid, r in recs.items():
        ceil = r["ceiling"]
        cells = [
            f"{r[d]['tps']:6.2f} ({r[d]['tps'] / r[LLAMA]['tps']:.2f}x, {r[d]['of_ceiling']:.2f})"
            for d in DECODERS[1:]
        ]
        print(
            f"{rid[:30]:30} {ceil['tokens']:6d} {ceil['speedup']:7.2f}x {ceil['alpha']:6.3f} "
            f"{ceil['best_k']:3d} {r[LLAMA]['tps']:12.2f} "
            + " ".join(f"{c:>24}" for c in cells)
            + f"  {r[DECODERS[1]]['rows_per_pass']:.1f}"
        )
    new, old, today = DECODERS[1], DECODERS[2], DECODERS[3]
    print(f"\n[{machine}] geometric means (requests):")
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in recs.values():
        groups.setdefault(f"{r['set']}:{r['kind']}", []).append(r)
        if r["set"] == "code_predict":
            whole = "code_predict edits" if is_edit(r) else "code_predict controls"
        else:
            whole = r["set"]
        groups.setdefault(whole, []).append(r)
    for name in sorted(groups):
        g = groups[name]
        parts = [
            f"{d} {gmean([r[d]['tps'] / r[LLAMA]['tps'] for r in g]):.3f}x "
            f"({gmean([r[d]['of_ceiling'] for r in g]):.3f} of ceiling)"
            for d in DECODERS[1:]
        ]
        print(f"  {name:34} ({len(g):2d}) " + ", ".join(parts))
    same = {d: sum(bool(r[d].get("same_as_llama")) for r in recs.values()) for d in DECODERS[1:]}
    print(
        f"  greedy outputs equal to {LLAMA}'s (llama.cpp's default numerics: near-ties may "
        "differ): " + ", ".join(f"{d} {n}/{len(recs)}" for d, n in same.items())
    )
    edits = [r for r in recs.values() if is_edit(r)]
    met = bool(edits)
    lines = []
    if edits:
        frac = gmean([r[new]["of_ceiling"] for r in edits])
        vs_old = gmean([r[new]["tps"] / r[old]["tps"] for r in edits])
        vs_today = gmean([r[new]["tps"] / r[today]["tps"] for r in edits])
        ok = frac >= RULE_CEILING
        met &= ok
        lines.append(
            f"code edits ({len(edits)}), {new}: {frac:.3f} of the ceiling (geometric "
            f"mean; rule >= {RULE_CEILING}): {'met' if ok else 'NOT met'}"
        )
        ok = vs_old > RULE_FASTER and vs_today > RULE_FASTER
        met &= ok
        lines.append(
            f"code edits, {new} / {old} {vs_old:.3f}x, {new} / {today} {vs_today:.3f}x "
            f"(rule: both above {RULE_FASTER}): {'met' if ok else 'NOT met'}"
        )
    ratios = {rid: r[new]["tps"] / r[LLAMA]["tps"] for rid, r in recs.items()}
    worst = min(ratios, key=lambda k: ratios[k])
    ok = ratios[worst] >= RULE_FLOOR
    met &= ok
    lines.append(
        f"every request, {new} / {LLAMA}: lowest {ratios[worst]:.3f}x ({worst}; rule >= "
        f"{RULE_FLOOR}): {'met' if ok else 'NOT met'}"
    )
    ex = data.get("exact", [])
    same = sum(e["identical"] for e in ex)
    ok = len(ex) >= RULE_EXACT_MIN and same == len(ex)
    met &= ok
    refused = (
        f" (exact numerics refused here: {data['exact_refused']})"
        if "exact_refused" in data
        else ""
    )
    lines.append(
        f"exact numerics, plain vs {new}: {same}/{len(ex)} edits identical (rule: all, "
        f"on >= {RULE_EXACT_MIN}): {'met' if ok else 'NOT met'}{refused}"
    )
    print(f"\n[{machine}] issue 41's rule (fixed before the run): {'MET' if met else 'NOT MET'}")
    for line in lines:
        print("  " + line)
    return met


def save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated: {', '.join(SETS)}")
    ap.add_argument("--new-tokens", type=int, default=1536, help="most tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--limit", type=int, default=0, help="first N requests per set (0: all)")
    ap.add_argument("--exact-check", type=int, default=RULE_EXACT_MIN, help="code edits (0: none)")
    ap.add_argument("--json", type=Path, default=None, help="results, written after each request")
    ap.add_argument("--resume", action="store_true", help="keep the requests of the --json file")
    ap.add_argument("--from-json", type=Path, default=None, help="print a saved file's report")
    args = ap.parse_args()
    if args.from_json:
        report(json.loads(args.from_json.read_text()))
        return 0
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not sets or any(s not in SETS for s in sets):
        sys.exit(f"--sets takes {', '.join(SETS)}")
    if args.new_tokens < 2 or args.threads < 1 or args.limit < 0 or args.exact_check < 0:
        sys.exit("--new-tokens >= 2, --threads >= 1, --limit >= 0 and --exact-check >= 0")
    if args.resume and not (args.json and args.json.exists()):
        sys.exit("--resume needs an existing --json file")

    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent / "studies"))  # baseline_prediction
    from baseline_prediction import PlannedSuffixDrafter as TodayPlanned
    from baseline_prediction import PredictionDrafter as TodayPrediction

    from specdec.bench.copy_ceiling import request_ceiling
    from specdec.bench.llama_own import llama_loop
    from specdec.drafters.planned import PlannedSuffixDrafter, planned_suffix
    from specdec.drafters.prediction import PredictionDrafter
    from specdec.drafters.suffix import SuffixDrafter
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.models.loader import ModelConfig
    from specdec.pairs import release
    from specdec.profiler.measure import target_costs
    from specdec.profiler.target_costs import N_MAX, REPEATS, cached_target_costs
    from specdec.prompt_sets import load_named_set
    from specdec.prompting import encode_prompt, encode_text
    from specdec.theory import Costs
    from specdec.util.machine import machine_info, machine_line

    def log(m: str) -> None:
        print(f"[bench] {m}", file=sys.stderr, flush=True)

    path = resolve(args.model)
    saved_args = {k: getattr(args, k) for k in RESUME_KEYS} | {"sets": sets}
    data: dict[str, Any] = {"args": saved_args, "requests": {}}
    if args.resume:
        data = json.loads(args.json.read_text())
        differ = [k for k in RESUME_KEYS if data["args"].get(k) != saved_args[k]]
        if differ:
            sys.exit(f"--resume: {args.json} was written with other arguments: {differ}")
    data["machine_line"] = machine_line()
    data["machine"] = machine_info()
    ours = LlamaCppLM(path, n_ctx=args.n_ctx, n_threads=args.threads)
    own = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=128,
        verbose=False,
    )
    cfg = ModelConfig(str(path), "llamacpp", n_ctx=args.n_ctx, n_threads=args.threads)
    if "curve_start" not in data:
        log("measuring the verify curve (passes of 1..65 rows)")
        costs = cached_target_costs(cfg, ours, log=log, refresh=True)
        data["costs"] = {
            "verify_s": list(costs.verify_s),
            "row_s": costs.row_s,
            "round_s": costs.round_s,
        }
        data["curve_start"] = curve_of(costs)
    c = data["costs"]
    costs = Costs(
        verify_s=tuple(c["verify_s"]), prefill_tps=math.inf, row_s=c["row_s"], round_s=c["round_s"]
    )
    today_costs = Costs(
        verify_s=costs.verify_s[: OLD_CAP + 1],
        prefill_tps=math.inf,
        row_s=costs.row_s,
        round_s=costs.round_s,
    )
    ratios = data["curve_start"]
    prompts = []
    for s in sets:
        got = load_named_set(s) or []
        prompts += got[: args.limit] if args.limit else got

    def runners(pred: list[int]) -> dict[str, Callable[[list[int]], dict[str, Any]]]:
        def ours_with(make: Callable[[], Any], k: int) -> Callable[[list[int]], dict[str, Any]]:
            return lambda ids: specdec_tokens(ours, make(), ids, args.new_tokens, k)

        def shipped() -> Any:
            return PredictionDrafter(
                pred, costs=costs, fallback=PlannedSuffixDrafter(planned_suffix(), costs)
            )

        def today() -> Any:
            fallback = TodayPlanned(SuffixDrafter(), today_costs)
            return TodayPrediction(pred, costs=today_costs, fallback=fallback)

        def llama(ids: list[int]) -> dict[str, Any]:
            r = llama_loop(own, ids, args.new_tokens)
            return {"decode_s": r.decode_s, "decode_tokens": r.decode_tokens, "run": r}

        return {
            LLAMA: llama,
            DECODERS[1]: ours_with(shipped, NEW_CAP),
            DECODERS[2]: ours_with(shipped, OLD_CAP),
            DECODERS[3]: ours_with(today, OLD_CAP),
        }

    # warm-up of both instances and every path (not recorded)
    warm = encode_prompt(ours, prompts[0].text, chat=True)[:64]
    llama_loop(own, warm, 8)
    for k in (NEW_CAP, OLD_CAP):
        specdec_tokens(ours, PredictionDrafter(warm[32:], costs=costs), warm, 8, k)
    for i, p in enumerate(prompts):
        if p.id in data["requests"]:
            continue
        ids = encode_prompt(ours, p.text, chat=True)
        pred = encode_text(ours, p.prediction or "", add_special_tokens=False)
        if len(ids) + args.new_tokens + NEW_CAP + 1 > args.n_ctx:
            log(f"{p.id}: {len(ids)} prompt tokens + {args.new_tokens} do not fit n_ctx; skipped")
            continue
        run = runners(pred)
        order = list(DECODERS[i % len(DECODERS) :] + DECODERS[: i % len(DECODERS)])
        got = {name: run[name](ids) for name in order}
        rec: dict[str, Any] = {
            "set": p.category,
            "kind": p.fine_category,
            "prompt_tokens": len(ids),
            "prediction_tokens": len(pred),
            "order": order,
            "machine_line": data["machine_line"],
        }
        ceiling = request_ceiling(pred, got[DECODERS[1]]["tokens"], ratios)
        rec["ceiling"] = ceiling.to_dict()
        base = got[LLAMA]["decode_tokens"] / got[LLAMA]["decode_s"]
        own_run = got[LLAMA]["run"]
        for name, g in got.items():
            tps = g["decode_tokens"] / g["decode_s"] if g["decode_s"] > 0 else math.nan
            rec[name] = {k: v for k, v in g.items() if k not in ("tokens", "run")} | {
                "tps": tps,
                "of_ceiling": tps / (ceiling.speedup * base),
            }
            if name != LLAMA:  # greedy: the same output as llama-cpp-python's loop?
                rec[name]["same_as_llama"] = own_run.same_output(g["tokens"])
        data["requests"][p.id] = rec
        log(
            f"{p.id}: {LLAMA} {base:.2f} tok/s; "
            + ", ".join(f"{n} {rec[n]['tps'] / base:.2f}x" for n in DECODERS[1:])
            + f"; ceiling {ceiling.speedup:.2f}x, K<=64 at {rec[DECODERS[1]]['of_ceiling']:.2f}"
        )
        if args.json:
            save(args.json, data)
    if "curve_end" not in data:
        log("measuring the verify curve again (drift over the run)")
        data["curve_end"] = curve_of(target_costs(ours, n_max=N_MAX, repeats=REPEATS))
        if args.json:
            save(args.json, data)
    release(ours, own)  # the exact instance below needs the memory
    if args.exact_check and "exact" not in data:
        edits = [
            p
            for p in load_named_set("code_predict") or []
            if not p.fine_category.startswith("control_")
        ]
        from specdec.models.exact import NotExactError

        try:
            data["exact"] = exact_check_in_child(
                path, edits, args.exact_check, args.new_tokens, args.threads
            )
        except NotExactError as e:  # this build and machine refuse exact numerics
            data["exact"] = []
            data["exact_refused"] = str(e)
            log(f"exact numerics refused: {e}")
    if args.json:
        save(args.json, data)
    report(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
