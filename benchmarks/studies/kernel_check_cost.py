"""What the kernel check (``llama_trust.kernel_check``) costs: the first load of a model on a
machine (the check runs: child processes with and without the optional kernels) against a
later load (the verdict is read from the cache) and a load with the check off, in one run.

For each model, ``--rounds`` times: a fresh verdict cache, then the three loads in turn
(first, cached, unchecked), each timed from the constructor's start to its return. Needs a
quiet machine (the children time the model's own loads).

    PYTHONPATH=src python benchmarks/studies/kernel_check_cost.py [--models NAME ...] [--rounds 2]
        [--json benchmarks/results/kernel-check-cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from specdec.hub import find_entry, model_path
from specdec.util.machine import cpu_flags, machine_info

MODELS = (
    "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-coder-1.5b-instruct-q4_k_m",
)


def _load_s(path: Path, threads: int, **kw: Any) -> tuple[float, Any]:
    from specdec.models.llamacpp import LlamaCppLM

    t0 = time.perf_counter()
    lm = LlamaCppLM(path, n_ctx=512, n_threads=threads, log=lambda _: None, **kw)
    return time.perf_counter() - t0, lm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for name in args.models:
        entry = find_entry(name)
        if entry is None or not model_path(entry).exists():
            print(f"skipped {name}: not in the store")
            continue
        path = model_path(entry)
        samples: dict[str, list[float]] = {"first": [], "cached": [], "unchecked": []}
        verdict = None
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                os.environ["SPECDEC_KERNEL_CHECKS"] = tmp
                s, lm = _load_s(path, args.threads)
                samples["first"].append(s)
                verdict = lm.kernels
                del lm
                s, lm = _load_s(path, args.threads)
                assert lm.kernels is not None and lm.kernels.cached
                samples["cached"].append(s)
                del lm
                s, lm = _load_s(path, args.threads, check_kernels=False)
                samples["unchecked"].append(s)
                del lm
        med = {k: statistics.median(v) for k, v in samples.items()}
        row = {
            "model": name,
            "median_s": med,
            "samples_s": samples,
            "first_run_cost_s": med["first"] - med["unchecked"],
            "cached_cost_s": med["cached"] - med["unchecked"],
            "verdict": None if verdict is None else verdict.to_dict(),
        }
        rows.append(row)
        print(
            f"{name}: load {med['unchecked']:.2f} s unchecked, {med['first']:.2f} s with the "
            f"first check (+{row['first_run_cost_s']:.2f} s), {med['cached']:.2f} s cached "
            f"(+{row['cached_cost_s']:.2f} s); verdict {verdict.choice if verdict else None}"
        )
    os.environ.pop("SPECDEC_KERNEL_CHECKS", None)
    if args.json is not None:
        flags = [f for f in cpu_flags() if f.startswith(("avx", "amx"))]
        out = {"machine": {**machine_info(), "cpu_flags": flags}, "rows": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
