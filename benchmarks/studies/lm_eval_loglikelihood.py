"""lm-evaluation-harness against `specdec serve`: a multiple-choice task from a local file (no
hub), speculation on and off, and every per-item log-likelihood checked against
llama-cpp-python's own (``Llama(logits_all=True)``) on the same GGUF.

    PYTHONPATH=src .venv/bin/python benchmarks/studies/lm_eval_loglikelihood.py \\
        --lm-eval /tmp/lmeval-venv/bin/lm_eval [--items 40] [--out DIR]

lm-eval (0.4.13 with its ``api`` extra, ``pip install "lm-eval[api]==0.4.13"`` in a virtual
environment of its own) runs its
``local-completions`` model with ``tokenizer_backend=remote`` (the server's ``/tokenize``,
``/detokenize`` and ``/tokenizer_info``) and sends each choice as ``prompt: [[ids]]``,
``echo: true, logprobs: 1, max_tokens: 1``; it reads ``choices[].logprobs.token_logprobs``.
The task: arithmetic questions with four answers each (written by this script with a fixed
seed into OUT/task/), scored by ``acc`` and ``acc_norm``.

1. ``specdec serve`` with the default pair (the 1.5B target, the 0.5B draft, K = 4), then the
   same server with ``-k 0`` (plain decoding), both with llama.cpp's own numerics
   (``--no-exact``, those of the reference in 2.): the scores and every per-item log-likelihood
   must be equal (the prompt is scored by the target's prefill, which speculation does not
   touch; the one generated token is not part of the score).
2. llama-cpp-python's own log-likelihoods of the same token ids (context and continuation
   split as lm-eval splits them), computed from ``Llama(logits_all=True).scores``, with its
   batch of 64 tokens (the passes specdec scores a prompt in: the same batch shapes) and with
   its default batch of 512 (other batch shapes: llama.cpp's batch-invariance gap). The
   differences are reported, not assumed.

Results: OUT/summary.json and OUT/summary.md; lm-eval's own outputs under OUT/on and OUT/off.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))
import servers as S

PORT = 18240
TASK = "specdec_arith_mc"


def write_task(root: Path, n_items: int, seed: int) -> Path:
    """A local multiple-choice task: ``n_items`` sums with four answers (one right)."""
    rnd = random.Random(seed)
    rows = []
    for _ in range(n_items):
        a, b = rnd.randint(10, 99), rnd.randint(10, 99)
        right = a + b
        wrong = {right + d for d in (-10, -1, 1, 10, 11, -11)} - {right}
        choices = [right, *rnd.sample(sorted(wrong), 3)]
        rnd.shuffle(choices)
        rows.append(
            {
                "question": f"What is {a} + {b}?",
                "choices": [f" {c}" for c in choices],
                "label": choices.index(right),
            }
        )
    root.mkdir(parents=True, exist_ok=True)
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (root / f"{TASK}.yaml").write_text(
        "\n".join(
            [
                f"task: {TASK}",
                "dataset_path: json",
                "dataset_kwargs:",
                "  data_files:",
                f"    test: {data}",
                "test_split: test",
                "output_type: multiple_choice",
                'doc_to_text: "Question: {{question}}\\nAnswer:"',
                "doc_to_choice: choices",
                "doc_to_target: label",
                "metric_list:",
                "  - metric: acc",
                "  - metric: acc_norm",
                "",
            ]
        ),
        encoding="utf-8",
    )
    return root


def run_lm_eval(lm_eval: str, url: str, task_dir: Path, out: Path) -> dict[str, Any]:
    """lm-eval's local-completions against ``url``; its results and per-item samples."""
    model_args = ",".join(
        [
            f"base_url={url}/v1/completions",
            "model=qwen2.5-coder-1.5b",
            "tokenizer_backend=remote",
            "tokenized_requests=True",
            "num_concurrent=1",
            "max_retries=1",
        ]
    )
    argv = [lm_eval, "--model", "local-completions", "--model_args", model_args]
    argv += ["--tasks", TASK, "--include_path", str(task_dir), "--output_path", str(out)]
    argv += ["--log_samples", "--seed", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # lm-eval's own environment
    t = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    (out / "lm_eval.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "lm_eval.log").write_text(p.stdout + p.stderr, encoding="utf-8")
    if p.returncode != 0:
        raise SystemExit(f"lm-eval failed ({p.returncode}); see {out / 'lm_eval.log'}")
    results = json.loads(sorted(out.rglob("results_*.json"))[-1].read_text())
    items: list[dict[str, Any]] = []
    for line in sorted(out.rglob(f"samples_{TASK}_*.jsonl"))[-1].read_text().splitlines():
        s = json.loads(line)
        for j, (args, resp) in enumerate(zip(sample_arguments(s), s["resps"], strict=True)):
            ll, greedy = resp[0]
            items.append(
                {
                    "doc": s["doc_id"],
                    "choice": j,
                    "context": args[0],
                    "continuation": args[1],
                    "loglikelihood": float(ll),
                    "is_greedy": greedy is True or str(greedy) == "True",  # "False" is a str
                }
            )
    return {"results": results["results"][TASK], "items": items, "seconds": time.monotonic() - t}


def sample_arguments(sample: dict[str, Any]) -> list[tuple[str, str]]:
    """(context, continuation) per request of one logged sample: a list of pairs in older
    lm-eval, ``{"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}`` in 0.4.13 (iterating that
    dict gave its keys' letters: the first run scored "g" + "e" against the server's items)."""
    args = sample["arguments"]
    if isinstance(args, dict):
        keyed = sorted(args.items(), key=lambda kv: int(str(kv[0]).rsplit("_", 1)[-1]))
        return [(str(a["arg_0"]), str(a["arg_1"])) for _, a in keyed]
    return [(str(a[0]), str(a[1])) for a in args]


def split_pair(tokenize: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: trailing spaces of the context move to the continuation,
    the continuation's ids are those of context + continuation past the context's."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenize(context + continuation)
    ctx = tokenize(context)
    return ctx, whole[len(ctx) :]


def reference(items: list[dict[str, Any]], n_batch: int) -> list[float]:
    """llama-cpp-python's log-likelihood of each item's continuation, from its own logits
    (``logits_all=True``), float64 log-softmax."""
    from llama_cpp import Llama

    llm = Llama(
        S.model_path(S.TARGET),
        logits_all=True,
        n_ctx=1024,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=2,
        verbose=False,
    )

    def tokenize(text: str) -> list[int]:
        return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    out = []
    for it in items:
        ctx, cont = split_pair(tokenize, it["context"], it["continuation"])
        ids = ctx + cont
        llm.reset()
        llm.eval(ids)
        scores = np.asarray(llm.scores[: len(ids)], dtype=np.float64)  # [n, V]
        ll = 0.0
        for j in range(len(ctx), len(ids)):
            row = scores[j - 1]
            m = row.max()
            ll += row[ids[j]] - (m + math.log(np.exp(row - m).sum()))
        out.append(ll)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm-eval", required=True, help="the lm_eval command (its own venv)")
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=S.REPO / "benchmarks/results/lm-eval-loglikelihood")
    a = ap.parse_args(argv)
    task_dir = write_task(a.out / "task", a.items, a.seed)
    runs: dict[str, dict[str, Any]] = {}
    # llama.cpp's own numerics (--no-exact), those of the llama-cpp-python reference below
    for side, extra in (("on", ["--no-exact"]), ("off", ["-k", "0", "--no-exact"])):
        spec = S.specdec_serve(PORT, extra=extra, name=f"serve-{side}")
        with S.running([spec], a.out / "logs"):
            runs[side] = run_lm_eval(a.lm_eval, spec.url, task_dir, a.out / side)
    on, off = runs["on"]["items"], runs["off"]["items"]
    assert [(i["doc"], i["choice"]) for i in on] == [(i["doc"], i["choice"]) for i in off]
    ll_on = np.array([i["loglikelihood"] for i in on])
    ll_off = np.array([i["loglikelihood"] for i in off])
    refs = {n: np.array(reference(on, n)) for n in (64, 512)}
    summary = {
        "task": TASK,
        "items": a.items,
        "requests": len(on),
        "scores_on": runs["on"]["results"],
        "scores_off": runs["off"]["results"],
        "lm_eval_seconds": {k: v["seconds"] for k, v in runs.items()},
        "max_abs_diff_on_off": float(np.abs(ll_on - ll_off).max()),
        "on_off_bit_identical": bool(np.array_equal(ll_on, ll_off)),
        "is_greedy_equal": [i["is_greedy"] for i in on] == [i["is_greedy"] for i in off],
        "max_abs_diff_vs_llama_cpp_python": {
            f"n_batch {n}": float(np.abs(ll_on - r).max()) for n, r in refs.items()
        },
        "mean_abs_diff_vs_llama_cpp_python": {
            f"n_batch {n}": float(np.abs(ll_on - r).mean()) for n, r in refs.items()
        },
        "per_item": [
            {
                **{k: i[k] for k in ("doc", "choice", "continuation", "loglikelihood")},
                "llama_cpp_python_n_batch_64": float(refs[64][j]),
                "llama_cpp_python_n_batch_512": float(refs[512][j]),
            }
            for j, i in enumerate(on)
        ],
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    acc = {s: runs[s]["results"].get("acc,none") for s in ("on", "off")}
    lines = [
        f"# lm-eval `local-completions` against `specdec serve`: {TASK}",
        "",
        f"{a.items} items x 4 choices = {len(on)} loglikelihood requests (echo, logprobs 1, "
        "max_tokens 1, token-id prompts); target qwen2.5-coder-1.5b-instruct-q4_k_m.",
        "",
        "| | speculation on (0.5B draft, K = 4) | off (-k 0) |",
        "|---|---|---|",
        f"| acc | {acc['on']} | {acc['off']} |",
        f"| acc_norm | {runs['on']['results'].get('acc_norm,none')} | "
        f"{runs['off']['results'].get('acc_norm,none')} |",
        "",
        f"- per-item log-likelihoods on vs off: bit-identical {summary['on_off_bit_identical']} "
        f"(max |diff| {summary['max_abs_diff_on_off']:.3g}); is_greedy equal "
        f"{summary['is_greedy_equal']}",
    ]
    for n in (64, 512):
        key = f"n_batch {n}"
        lines.append(
            f"- against llama-cpp-python's `Llama(logits_all=True)`, {key}: max |diff| "
            f"{summary['max_abs_diff_vs_llama_cpp_python'][key]:.3g} nats, mean "
            f"{summary['mean_abs_diff_vs_llama_cpp_python'][key]:.3g}"
        )
    (a.out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
