"""How far apart healthy llama.cpp kernels' logits are: the measurement the kernel check's
tolerance (``llama_trust.kernel_check.TV_TOLERANCE``) is taken from.

For each model and thread count, the kernel check's own child pass (``llama_trust.kernel_probe``:
one 20-row pass and four one-row passes) runs with every optional kernel the build offers and
with none, each with ggml's tiled K-quant path on and off: four healthy kernel sets. For every
pair of them, the row-wise total variation distance between the next-token distributions
(and the largest absolute logit difference) is recorded.
These are differences between kernels that both compute correctly (the repacked gemm/gemv
against the plain dot products, the tiled path against the untiled one), so they bound what
the check must accept. Numbers, not timings: the run does not need a quiet machine.

    python benchmarks/studies/kernel_diffs.py [--models NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from specdec.hub import find_entry, model_path
from specdec.llama_trust.kernel_check import CheckSettings, _probe, row_tv
from specdec.llama_trust.kernel_probe import Choice
from specdec.util.machine import cpu_flags, machine_info

MODELS = (
    "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-coder-1.5b-instruct-q4_k_m",
)
TILED_ENV = "GGML_CPU_TILED_MM"


def _paths(names: list[str], with_q4_0: bool) -> list[tuple[str, Path]]:
    out = []
    for name in names:
        entry = find_entry(name)
        if entry is None or not model_path(entry).exists():
            print(f"skipped {name}: not in the store")
            continue
        out.append((name, model_path(entry)))
    if with_q4_0 and out:
        from specdec.models.requantize import requantize

        name, path = out[0]
        out.append((f"{name} requantized to q4_0", requantize(path, "q4_0", pure=True).path))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/kernel-diffs.json"))
    args = ap.parse_args()
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ggml

    listed = tuple(ggml(llama_cpp).extra_types())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in _paths(args.models, with_q4_0=True):
            for threads in args.threads:
                settings = CheckSettings(n_threads=threads, fault=None)
                logits = {}
                for tiled in ("1", "0"):
                    os.environ[TILED_ENV] = tiled  # the children inherit it
                    for choice in (Choice(), Choice(extras=False)):
                        out = Path(tmp) / f"{choice.text()}-{tiled}.npy"
                        outcome, detail, _ = _probe(path, choice, listed, settings, 600, out)
                        assert outcome == "ok", (name, choice, outcome, detail)
                        with out.open("rb") as f:
                            logits[f"{choice.text()}/tiled={tiled}"] = np.load(
                                f, allow_pickle=False
                            )
                for x, y in itertools.combinations(sorted(logits), 2):
                    a, b = logits[x], logits[y]
                    row = {
                        "model": name,
                        "threads": threads,
                        "pair": [x, y],
                        "tv_max": row_tv(a, b),
                        "max_abs": float(np.abs(a.astype(np.float64) - b).max()),
                        "top1_agree": float((a.argmax(-1) == b.argmax(-1)).mean()),
                    }
                    rows.append(row)
                    print(json.dumps(row))
    os.environ.pop(TILED_ENV, None)
    worst = max(rows, key=lambda r: r["tv_max"])
    result = {
        "machine": {
            **machine_info(),
            "cpu_flags": [f for f in cpu_flags() if "avx" in f or "amx" in f],
        },
        "llama_cpp_python": llama_cpp.__version__,
        "listed": list(listed),
        "compared": "all optional kernels / none, tiled path on / off: every pair",
        "rows": rows,
        "worst": worst,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"largest row TV {worst['tv_max']:.4f} ({worst['model']}, {worst['threads']} threads, "
        f"{' vs '.join(worst['pair'])}); written to {args.out}"
    )


if __name__ == "__main__":
    main()
