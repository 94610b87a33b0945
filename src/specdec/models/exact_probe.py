"""The child process of the exact-numerics check (``llama_trust.exact_kernels``): load a GGUF with
one kernel choice and exact numerics' other settings, compare passes of ``PROBE_ROWS`` rows
with one-token passes bitwise, print one JSON line (``exact``, ``detail``).

    python -m specdec.models.exact_probe MODEL --threads N --choice all|avoid:A,B

A module of its own because it loads the model (``models.llamacpp``), which itself asks
``llama_trust.exact_kernels`` for the verdict: the parent side must not import the backend.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from specdec.llama_trust.exact_kernels import (
    FAULT_ENV,
    PROBE_CONTEXT,
    PROBE_ROWS,
    PROBE_TEXT,
    exact_attention,
)
from specdec.llama_trust.ggml_bufts import Choice


def probe(path: str, choice: Choice, threads: int, fault: str) -> dict[str, Any]:
    """In the child: load with ``choice`` and exact numerics' other settings, compare passes
    of ``PROBE_ROWS`` rows with one-token passes bitwise."""
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ggml, weight_groups
    from specdec.models.exact import check_rows_exact
    from specdec.models.llamacpp import LlamaCppLM

    need = PROBE_CONTEXT + max(PROBE_ROWS)
    att = exact_attention(llama_cpp)
    lm = LlamaCppLM(
        path, n_ctx=need + 8, n_threads=threads, kernels=choice, flash_attn=att.flash_attn,
        type_k=att.type_k, type_v=att.type_v,
    )  # fmt: skip
    ids = lm.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    ids = [i % lm.vocab_size for i in (ids * (need // max(1, len(ids)) + 1))[:need]]
    checks = check_rows_exact(lm, ids[:PROBE_CONTEXT], ids[PROBE_CONTEXT:], PROBE_ROWS)
    bad = next((c for c in checks if not c.exact), None)
    if bad is not None:
        detail = f"row {bad.first_row} of a {bad.n}-token pass differs by {bad.max_abs:.3g}"
    else:
        detail = "identical"
    from specdec.hub.gguf import check_gguf_header

    if fault and fault in weight_groups(ggml(llama_cpp), check_gguf_header(path).tensors, choice):
        bad, detail = checks[0], f"injected for {fault} ({FAULT_ENV})"
    return {"exact": bad is None, "detail": detail}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.models.exact_probe")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--choice", required=True)
    args = ap.parse_args(argv)
    result = probe(
        args.model, Choice.parse(args.choice), args.threads, os.environ.get(FAULT_ENV, "")
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
