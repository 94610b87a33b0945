"""The plain baselines side by side, interleaved in one process on the same GGUF:

  A  llama-cpp-python's own decoding loop (``Llama.create_completion``, greedy, streamed so
     that prefill and decode can be told apart)
  B  specdec's llama.cpp backend with K = 0 (``specdec generate -k 0 --target-backend llamacpp``)
  A' optional (``--shared-instance``): llama-cpp-python's own loop on the very ``Llama``
     object specdec's backend wraps, so the two loops are compared on the same weights in
     memory (two instances of one GGUF can differ by a few per cent on this machine, which
     is not the loop's doing)
  C  optional: specdec with drafters on the same backend (``--draft``, repeatable: ngram,
     suffix, hybrid:MODEL, a draft model, or ``auto``: per prompt, what ``specdec generate
     --auto`` runs, the cached profile's choice for that prompt's length, with its costs and
     K, plain decoding where it chooses plain; or ``prediction``: each prompt's prediction,
     for sets that carry one such as ``--source code_predict``, drafted in front of the
     planned suffix drafter as ``Pair.generate(prediction=...)`` does), and with ``--pad-to
     N`` the same drafters on a backend instance whose verify passes are padded to N rows

Prompt by prompt, each decoder runs once per repeat, in an order rotated per prompt and
repeat, so slow drift hits them alike; the script prints decode tokens/s, prefill seconds and
the ratios B/A (and C/A) per prompt, their geometric means, and per category the geometric
mean over its prompts with a 90 % bootstrap interval over prompts (seeded; the bench's
cluster bootstrap). With ``auto``
among the decoders it also prints the verdict of issue 11's floor, fixed before any run:
``auto`` at >= 0.95x of llama-cpp-python's loop (the geometric mean over each category's
prompts) on every category; with ``prediction``, the verdict of issue 27's rule, also fixed
before any run (``PREDICTION_*`` below). Prompts of a set with predictions are grouped by
their kind of task. Greedy, the same thread count for all.

``--reuse-prompt`` measures decoding only: each instance keeps the prompt it holds between
the runs of one prompt (llama-cpp-python's own prefix reuse, which evaluates the last
prompt token again; specdec's ``reuse_prefix``, which keeps prompt[:-1] and passes the last
prompt token in its first round), so a prompt is prefilled once per instance instead of once
per run. Decode tokens/s (after the first token) are the same computation either way; the
end-to-end ratios are not printed in this mode. It cannot be combined with
``--shared-instance`` (that loop empties the shared cache). ``--no-plain`` leaves out B.

The raw figures are written to ``--json`` after every prompt; ``--resume`` keeps the complete
prompts of that file (run with the same arguments) and measures the rest.

    python benchmarks/plain_baselines.py --source all --new-tokens 64 --repeats 2 [--draft suffix]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

# issue 11's floor, fixed before the runs: the decoder ``auto`` at >= this fraction of
# llama-cpp-python's decode speed, as the geometric mean over each category's prompts
FLOOR = 0.95
FLOOR_DECODER = "auto"
# predicted outputs (the code_predict set; issue 27), fixed before the runs: the decoder
# ``prediction`` against llama-cpp-python's decode speed, per prompt: the geometric mean over
# the edit tasks (every kind but the controls) >= 1.5x with no edit prompt below 1.0x, and the
# geometric mean of each control with an empty or an unrelated prediction >= 0.97x
PREDICTION_DECODER = "prediction"
PREDICTION_EDITS_MEAN = 1.5
PREDICTION_EDITS_MIN = 1.0
PREDICTION_CONTROLS = ("control_empty", "control_unrelated")
PREDICTION_CONTROL_MEAN = 0.97


def llama_cpp_own(
    llm, prompt_ids: list[int], n_new: int, *, reuse_prompt: bool = False
) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """(prefill seconds, decode seconds, tokens) of llama-cpp-python's own greedy loop
    (``create_completion``, streamed, as a user calls it).

    Tokens are timed where llama-cpp-python samples them (its ``stopping_criteria`` hook is
    called once per sampled token, the end-of-generation token included, with the ids up to
    that token; ``create_completion`` calls it once more after its loop with the same ids as
    the last token's call, which is not a token and is dropped), not by counting streamed
    chunks: the stream ends with an extra chunk that carries no token (the finish
    reason), and it holds back tokens that end in an incomplete UTF-8 character, so chunk
    counts credited the loop with one token more than its passes on every full-length run
    (64 tokens counted for 63 passes). The decode window runs from the first sampled token
    to the last, the same window as ``specdec_run``'s: one pass per token after the first.
    With ``reuse_prompt`` the library keeps the prefix its cache shares with the prompt."""
    import llama_cpp

    if not reuse_prompt:
        llm.reset()
    first_seen: dict[int, float] = {}  # ids length at the call -> its first time

    def at_each_token(ids, _logits) -> bool:  # type: ignore[no-untyped-def]
        first_seen.setdefault(len(ids), time.perf_counter())
        return False

    t0 = time.perf_counter()
    for _ in llm.create_completion(
        prompt_ids,
        max_tokens=n_new,
        temperature=0.0,
        top_k=1,
        stream=True,
        stopping_criteria=llama_cpp.StoppingCriteriaList([at_each_token]),
    ):
        pass
    stamps = sorted(first_seen.values())
    assert stamps, "llama-cpp-python sampled no token"
    return stamps[0] - t0, stamps[-1] - stamps[0], len(stamps) - 1


def llama_cpp_shared(ours, prompt_ids: list[int], n_new: int) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """llama-cpp-python's own loop on specdec's backend's Llama object; the KV cache is
    emptied before and after so that neither loop sees the other's cells."""
    ours.truncate(0)
    out = llama_cpp_own(ours.llm, prompt_ids, n_new)
    ours.llm.reset()
    ours.truncate(0)
    return out


def specdec_run(
    target, draft, prompt_ids: list[int], n_new: int, k, *, reuse_prompt: bool = False
) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    from specdec.core.loop import generate

    res = generate(target, draft, prompt_ids, max_new_tokens=n_new, k=k, reuse_prefix=reuse_prompt)
    first = res.rounds[0].t_round if res.rounds else 0.0
    decode = res.t_total - res.t_prefill - first
    return res.t_prefill + first, decode, len(res.tokens) - res.rounds[0].n_emitted


Rows = dict[str, dict[str, list[tuple[float, float, int]]]]  # prompt -> decoder -> runs


def gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def prompt_of(key: str) -> str:
    """The prompt id of a row key (``pooled`` keys a prompt of run i as ``<id> #i``)."""
    return key.split(" #", 1)[0]


def interval(xs: list[float], keys: list[str]) -> tuple[float, float]:
    """90 % bootstrap interval of the geometric mean of the per-prompt ratios ``xs``,
    resampling prompts (``bench.analysis``' cluster bootstrap, seeded): a prompt measured in
    several pooled runs is one unit. How far the category's figure could move with other
    prompts of the same kind (the noise of each prompt's runs is inside it)."""
    from specdec.stats.bootstrap import cluster_bootstrap_geomean

    return cluster_bootstrap_geomean(xs, [prompt_of(k) for k in keys], level=0.90)


def floor_verdict(by_category: dict[str, float], floor: float = FLOOR) -> tuple[bool, str]:
    """(every category at or above ``floor``, the lowest category)."""
    lowest = min(by_category, key=lambda c: by_category[c])
    return by_category[lowest] >= floor, lowest


def prediction_verdict(
    ratios: dict[str, float], categories: dict[str, str]
) -> tuple[bool, list[str]]:
    """The predicted-outputs rule (PREDICTION_*) on per-prompt ratios against
    llama-cpp-python's loop: (met, the lines that say why)."""
    edits = {p: r for p, r in ratios.items() if not categories[p].startswith("control_")}
    lines, met = [], True
    if edits:
        mean = gmean(list(edits.values()))
        lo, hi = interval(list(edits.values()), list(edits))
        worst = min(edits, key=lambda p: edits[p])
        ok = mean >= PREDICTION_EDITS_MEAN and edits[worst] >= PREDICTION_EDITS_MIN
        met &= ok
        lines.append(
            f"edits ({len(edits)} prompts): {mean:.3f}x (90 % bootstrap {lo:.3f}-{hi:.3f}), "
            f"lowest {edits[worst]:.3f}x ({worst}); rule >= {PREDICTION_EDITS_MEAN}x with none "
            f"below {PREDICTION_EDITS_MIN}x: {'met' if ok else 'NOT met'}"
        )
    for c in PREDICTION_CONTROLS:
        xs = [r for p, r in ratios.items() if categories[p] == c]
        if xs:
            ok = gmean(xs) >= PREDICTION_CONTROL_MEAN
            met &= ok
            lines.append(
                f"{c} ({len(xs)} prompts): {gmean(xs):.3f}x; rule >= "
                f"{PREDICTION_CONTROL_MEAN}x: {'met' if ok else 'NOT met'}"
            )
    return met, lines


def report(
    rows: Rows,
    categories: dict[str, str],
    prompt_tokens: dict[str, int],
    *,
    end_to_end: bool = True,
    floor_rule: str = "fixed before the run",
) -> None:
    """Print the per-prompt table, the geometric means, the per-category means (with their
    bootstrap intervals), the floor's verdict when ``auto`` ran, and the end to end ratios
    (every ratio against the first decoder, llama-cpp-python's own loop)."""
    pids = list(rows)
    names = list(rows[pids[0]])
    base = names[0]
    print(f"{'prompt':28} {'tokens in':>9} " + " ".join(f"{n[:22]:>24}" for n in names))
    print(f"(decode tokens/s after the first token; ratios against {names[0]})")
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for pid in pids:
        tps = {n: statistics.median(t / d for _, d, t in rows[pid][n] if d > 0) for n in names}
        cells = [f"{tps[base]:7.2f} tok/s"]
        for n in names[1:]:
            ratios[n].append(tps[n] / tps[base])
            cells.append(f"{tps[n]:7.2f} ({tps[n] / tps[base]:.3f}x)")
        print(f"{pid[:28]:28} {prompt_tokens[pid]:>9} " + " ".join(f"{c:>24}" for c in cells))
    for n, r in ratios.items():
        print(f"geometric mean, {n} / {base}: {gmean(r):.3f}x (decode tokens/s)")
    pairs = [(n, base, ratios[n]) for n in names[1:]]
    if "specdec plain" in ratios:  # the drafters against specdec's own plain loop too
        plain = ratios["specdec plain"]
        for n in names[1:]:
            if n != "specdec plain":
                pairs.append(
                    (n, "specdec plain", [a / b for a, b in zip(ratios[n], plain, strict=True)])
                )
    cats = list(dict.fromkeys(categories[pid] for pid in pids))
    print("per category, geometric mean over its prompts [lowest, highest prompt]:")
    print(f"  {'decoder / baseline':44} " + " ".join(f"{c[:16]:>22}" for c in cats))
    by_cat: dict[tuple[str, str], dict[str, float]] = {}
    for n, against, r in pairs:
        cells, spans = [], []
        for c in cats:
            keys = [pid for pid in pids if categories[pid] == c]
            xs = [x for pid, x in zip(pids, r, strict=True) if categories[pid] == c]
            by_cat.setdefault((n, against), {})[c] = gmean(xs)
            cells.append(f"{gmean(xs):.3f} [{min(xs):.2f}, {max(xs):.2f}]")
            lo, hi = interval(xs, keys)
            spans.append(f"({lo:.3f}, {hi:.3f})")
        print(f"  {(n + ' / ' + against)[:44]:44} " + " ".join(f"{x:>22}" for x in cells))
        print(f"  {'   90 % bootstrap over prompts':44} " + " ".join(f"{x:>22}" for x in spans))
    if (FLOOR_DECODER, base) in by_cat:
        means = by_cat[(FLOOR_DECODER, base)]
        met, lowest = floor_verdict(means)
        print(
            f"floor ({floor_rule}): {FLOOR_DECODER} / {base} >= {FLOOR:.2f}x on every "
            f"category: {'MET' if met else 'NOT MET'} (lowest: {lowest}, {means[lowest]:.3f}x)"
        )
    if PREDICTION_DECODER in ratios:
        met, lines = prediction_verdict(
            dict(zip(pids, ratios[PREDICTION_DECODER], strict=True)), categories
        )
        print(f"predicted outputs ({floor_rule}): {'MET' if met else 'NOT MET'}")
        for line in lines:
            print("  " + line)
    shared = "llama-cpp-python on specdec's Llama"
    if shared in ratios:  # the loops compared on one instance: B / A' per prompt
        same = [b / a for b, a in zip(ratios["specdec plain"], ratios[shared], strict=True)]
        print(
            f"geometric mean, specdec plain / {shared}: {gmean(same):.3f}x "
            f"(per prompt: {', '.join(f'{x:.2f}' for x in same)})"
        )
    # end to end (prefill + first token + decode), as base time / time: above 1 is faster
    if not end_to_end:
        print("end to end: not measured (--reuse-prompt: each instance prefilled a prompt once)")
        return
    print(f"end to end (prompt in to last token out), ratio of {base}'s time to each:")
    for n in names[1:]:
        e2e = []
        for pid in pids:
            t = {m: statistics.median(a + b for a, b, _ in rows[pid][m]) for m in (base, n)}
            e2e.append(t[base] / t[n])
        print(f"  {n}: {gmean(e2e):.3f}x (per prompt: {', '.join(f'{x:.2f}' for x in e2e)})")


def auto_choice(model: str, n_threads: int | None, prompt_tokens: int, new_tokens: int):  # type: ignore[no-untyped-def]
    """What ``specdec generate --auto`` (generate's defaults otherwise) runs for a prompt of
    this length: the cached profile's choice, never a new profile. Exits with a message when
    this machine has no profile of the target, or when the choice is not one this script
    runs (the planned suffix drafter or plain decoding on llama.cpp)."""
    from specdec.pairs import DEFAULT_DRAFT, is_planned
    from specdec.profiler.auto import auto_profile, choose

    result = auto_profile(
        model,
        draft=DEFAULT_DRAFT,
        target_backend="auto",
        draft_backend="auto",
        n_ctx=4096,
        n_threads=n_threads,
        cached_only=True,
    )
    if result is None:
        sys.exit(f"no cached profile of {model} on this machine: run `specdec profile` first")
    choice = choose(result, prompt_tokens, new_tokens)
    if choice.target_backend != "llamacpp" or (
        choice.speculative and not (is_planned(choice.draft_ref) and choice.costs is not None)
    ):
        sys.exit(f"--auto chose {choice.label}; this script runs planned or plain on llama.cpp")
    return choice


def load_saved(path: Path, model: str) -> tuple[Rows, dict[str, str], dict[str, int], bool]:
    """(rows, categories, prompt tokens, measured with --reuse-prompt) of a saved ``--json``
    file (files from before 11-30 lack the categories and token counts: they are taken from
    the prompt set and the model's tokenizer)."""
    data = json.loads(path.read_text())
    rows: Rows = {
        pid: {n: [tuple(run) for run in runs] for n, runs in by.items()}  # type: ignore[misc]
        for pid, by in data["prompts"].items()
    }
    categories, tokens = data.get("categories"), data.get("prompt_tokens")
    if categories is None or tokens is None:
        from specdec.hub import resolve
        from specdec.models.llamacpp import LlamaCppLM
        from specdec.prompt_sets import select_prompts
        from specdec.prompting import encode_prompt

        a = data["args"]
        prompts = {
            p.id: p
            for p in select_prompts(a["source"], per_category=int(a["per_category"]))
            if p.id in rows
        }
        lm = LlamaCppLM(resolve(a.get("model", model)), n_ctx=4096, n_threads=1)
        categories = {pid: prompts[pid].category for pid in rows}
        tokens = {pid: len(encode_prompt(lm, prompts[pid].text, chat=True)) for pid in rows}
    return rows, categories, tokens, bool(data["args"].get("reuse_prompt", False))


def pooled(
    runs: list[tuple[Rows, dict[str, str], dict[str, int]]],
) -> tuple[Rows, dict[str, str], dict[str, int]]:
    """Several saved runs as one: each prompt of run i is keyed ``<id> #i``, and only the
    decoders every run has are kept (in the first run's order)."""
    names = [
        n
        for n in next(iter(runs[0][0].values()))
        if all(n in next(iter(r.values())) for r, _, _ in runs)
    ]
    rows: Rows = {}
    categories: dict[str, str] = {}
    tokens: dict[str, int] = {}
    for i, (r, cats, toks) in enumerate(runs, start=1):
        for pid, by in r.items():
            key = f"{pid} #{i}"
            rows[key] = {n: by[n] for n in names}
            categories[key], tokens[key] = cats[pid], toks[pid]
    return rows, categories, tokens


def report_saved(paths: list[Path], model: str) -> int:
    """The report of one saved ``--json`` file, or of several pooled (see ``pooled``)."""
    loaded = [load_saved(p, model) for p in paths]
    if len(loaded) == 1:
        rows, categories, tokens, reuse = loaded[0]
        report(rows, categories, tokens, end_to_end=not reuse)
        return 0
    print(
        f"{len(paths)} runs pooled ({', '.join(p.name for p in paths)}); a prompt measured in "
        "several runs counts once per run in the means, and is one unit of the bootstrap"
    )
    rows, categories, tokens = pooled([(r, c, t) for r, c, t, _ in loaded])
    report(
        rows,
        categories,
        tokens,
        end_to_end=not any(reuse for *_, reuse in loaded),
        floor_rule="the same rule on the pooled runs, chosen after them",
    )
    return 0


# the arguments a resumed run must share with the file it continues
RESUME_KEYS = ("model", "source", "per_category", "new_tokens", "repeats", "threads", "draft", "k")
RESUME_KEYS += ("pad_to", "shared_instance", "reuse_prompt", "no_plain")


def resumed_rows(path: Path, args: dict[str, object], names: list[str]) -> Rows:
    """The complete prompts of a ``--json`` file written with the same arguments (every
    decoder with all its repeats); exits with a message when the arguments differ."""
    data = json.loads(path.read_text())
    saved = data.get("args", {})
    differ = [k for k in RESUME_KEYS if saved.get(k) != args.get(k)]
    if differ:
        sys.exit(f"--resume: {path} was written with other arguments ({', '.join(differ)})")
    repeats = int(str(args["repeats"]))
    return {
        pid: {n: [tuple(run) for run in by[n]] for n in names}  # type: ignore[misc]
        for pid, by in data["prompts"].items()
        if all(len(by.get(n, [])) == repeats for n in names)
    }


def save(
    path: Path,
    rows: Rows,
    categories: dict[str, str],
    tokens: dict[str, int],
    args: dict[str, object],
) -> None:
    """Write the raw figures (replacing the file in one step, so a crash keeps the last)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        json.dumps(
            {
                "prompts": rows,
                "categories": {pid: categories[pid] for pid in rows},
                "prompt_tokens": {pid: tokens[pid] for pid in rows},
                "args": args,
            },
            default=str,
        )
    )
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--source", default="all", help="prompt set: spec_bench, code, all, a file")
    ap.add_argument("--per-category", type=int, default=1, help="prompts per category")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft", action="append", default=[], help="also run this drafter (C)")
    ap.add_argument("-k", type=int, default=8, help="K for the drafter runs")
    ap.add_argument("--pad-to", type=int, default=None, help="also run drafters padded")
    ap.add_argument(
        "--shared-instance",
        action="store_true",
        help="also run llama-cpp-python's loop on specdec's own Llama object (A')",
    )
    ap.add_argument(
        "--reuse-prompt",
        action="store_true",
        help="decode only: each instance keeps the prompt it holds between one prompt's runs",
    )
    ap.add_argument("--no-plain", action="store_true", help="leave out specdec's plain loop (B)")
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    ap.add_argument(
        "--resume", action="store_true", help="keep the complete prompts of the --json file"
    )
    ap.add_argument(
        "--from-json",
        type=Path,
        action="append",
        default=None,
        help="print the report of a saved --json file (repeatable: the runs pooled)",
    )
    args = ap.parse_args()
    if args.from_json:
        return report_saved(args.from_json, args.model)
    if args.reuse_prompt and args.shared_instance:
        sys.exit("--reuse-prompt cannot be combined with --shared-instance")
    if args.resume and not (args.json and args.json.exists()):
        sys.exit("--resume needs an existing --json file")
    reuse = args.reuse_prompt

    import llama_cpp

    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.pairs import parse_drafter
    from specdec.prompt_sets import select_prompts
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
    from specdec.drafters.planned import PlannedSuffixDrafter
    from specdec.models.loader import ModelConfig
    from specdec.pairs import HYBRID_PREFIX, HybridRef, is_model_free, is_planned, load_pair
    from specdec.profiler.target_costs import cached_target_costs

    def auto_run(target, prompt_ids: list[int]) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
        """What ``generate --auto`` runs for this prompt (no profiling here: a cached one)."""
        choice = auto_choice(args.model, None, len(prompt_ids), args.new_tokens)
        if not choice.speculative:
            return specdec_run(target, None, prompt_ids, args.new_tokens, 0, reuse_prompt=reuse)
        d = PlannedSuffixDrafter(parse_drafter(choice.draft_ref), choice.costs)
        return specdec_run(
            target, d, prompt_ids, args.new_tokens, choice.policy(), reuse_prompt=reuse
        )

    def drafter_for(ref: str, target):  # type: ignore[no-untyped-def]
        if is_planned(ref):  # the target's costs, measured once and cached as generate does
            cfg = ModelConfig(args.model, "llamacpp", n_threads=args.threads)
            return PlannedSuffixDrafter(parse_drafter(ref), cached_target_costs(cfg, target))
        if is_model_free(ref):
            return parse_drafter(ref)
        cfg = ModelConfig(ref.removeprefix(HYBRID_PREFIX), "llamacpp", n_threads=args.threads)
        draft, _ = load_pair(
            HybridRef(cfg) if ref.startswith(HYBRID_PREFIX) else cfg,
            ModelConfig(str(path), "llamacpp", n_ctx=4096, n_threads=args.threads),
            loader=lambda c: target if c.model == str(path) else _load(c),
        )
        return draft

    def _load(c):  # type: ignore[no-untyped-def]
        from specdec.models.loader import load_model

        return load_model(c)

    padded = (
        LlamaCppLM(path, n_ctx=4096, n_threads=args.threads, pad_to=args.pad_to)
        if args.pad_to
        else None
    )
    prompts = select_prompts(args.source, per_category=args.per_category)
    ids = {p.id: encode_prompt(ours, p.text, chat=True) for p in prompts}
    # each prompt's prediction (the code_predict set), by its token ids: runners get ids only
    predictions = {
        tuple(ids[p.id]): ours.tokenizer.encode(p.prediction, add_special_tokens=False)
        for p in prompts
        if p.prediction is not None
    }

    def prediction_run(prompt_ids: list[int]) -> tuple[float, float, int]:
        """The prompt's prediction drafted in front of the planned suffix drafter (what
        ``Pair.generate(prediction=...)`` runs on the default pair), K capped at 16."""
        from specdec.drafters.prediction import PredictionDrafter
        from specdec.pairs import PLANNED_K

        planned = drafter_for("planned", ours)
        d = PredictionDrafter(
            predictions.get(tuple(prompt_ids), []), costs=planned.costs, fallback=planned
        )
        return specdec_run(ours, d, prompt_ids, args.new_tokens, PLANNED_K, reuse_prompt=reuse)

    runners = {
        "llama-cpp-python": lambda p: llama_cpp_own(own, p, args.new_tokens, reuse_prompt=reuse),
        "specdec plain": lambda p: specdec_run(
            ours, None, p, args.new_tokens, 0, reuse_prompt=reuse
        ),
    }
    if args.no_plain:
        del runners["specdec plain"]
    if args.shared_instance:
        runners["llama-cpp-python on specdec's Llama"] = lambda p: llama_cpp_shared(
            ours, p, args.new_tokens
        )
    for ref in args.draft:
        if ref == "auto":
            runners["auto"] = lambda p: auto_run(ours, p)
            continue
        if ref == PREDICTION_DECODER:
            runners[PREDICTION_DECODER] = prediction_run
            continue
        for target, tag in ((ours, ""), (padded, f"+pad{args.pad_to}")):
            if target is None:
                continue
            d = drafter_for(ref, target)
            runners[f"{ref}{tag} K={args.k}"] = lambda p, d=d, t=target: specdec_run(
                t, d, p, args.new_tokens, args.k, reuse_prompt=reuse
            )
    names = list(runners)
    # the predicted-outputs set is reported by kind of task (edits, and the controls)
    categories = {
        p.id: p.fine_category if p.prediction is not None else p.category for p in prompts
    }
    tokens = {k: len(v) for k, v in ids.items()}
    saved_args = vars(args) | {"json": str(args.json) if args.json else None}
    rows: Rows = resumed_rows(args.json, saved_args, names) if args.resume else {}
    first = next(iter(ids.values()))
    for r in runners.values():  # warm-up
        r(first[:32])
    # prompt by prompt (with --reuse-prompt a prompt is prefilled once per instance), each
    # decoder once per repeat in an order rotated per prompt and repeat
    for i, p in enumerate(prompts):
        if p.id in rows:
            continue
        runs: dict[str, list[tuple[float, float, int]]] = {n: [] for n in names}
        for rep in range(args.repeats):
            order = names[(rep + i) % len(names) :] + names[: (rep + i) % len(names)]
            for name in order:
                runs[name].append(runners[name](ids[p.id]))
        rows[p.id] = runs
        if args.json:
            save(args.json, rows, categories, tokens, saved_args)
    rows = {p.id: rows[p.id] for p in prompts}
    report(rows, categories, tokens, end_to_end=not reuse)
    if args.json:
        save(args.json, rows, categories, tokens, saved_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
