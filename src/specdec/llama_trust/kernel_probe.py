"""The child process of the kernel check (``llama_trust.kernel_check``): load a GGUF with one choice
of llama.cpp's optional CPU kernels, score a fixed token sequence, write the logits.

    python -m specdec.llama_trust.kernel_probe MODEL OUT.npy --threads N --choice all|none|avoid:A,B
        [--fault KIND:BUFT]

The sequence is scored as one pass of ``BATCH_ROWS`` tokens (the batched kernels: gemm, tiled
and repacked paths) and then ``SINGLE_ROWS`` one-token passes (the gemv paths), so both kinds
of matrix product run. OUT holds the float32 logits [BATCH_ROWS + SINGLE_ROWS, V]; the last
line on stdout is a JSON object (``ok``, ``load_s``, ``pass_s``). Whatever kills this process
(a signal, an abort inside ggml, a hang) is the parent's evidence; nothing here catches it.

``--fault`` is the test hook the parent passes on from ``SPECDEC_TEST_KERNEL_FAULT``: when the
named buffer type is in use in this child, it dies the way a broken kernel does (``segv``,
``ill``, ``abort``), hangs (``hang``) or returns wrong numbers (``wrong``), so that the
parent's handling of each can be tested on machines that have no broken kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

from specdec.llama_trust.ggml_bufts import Choice

BATCH_ROWS = 20  # past every row-count switch of ggml's CPU matrix products (2, 4, 8, 16)
SINGLE_ROWS = 4
FAULTS = ("segv", "ill", "abort", "hang", "wrong")
_TEXT = "def mean(xs):\n    return sum(xs) / len(xs)  # the average of 1, 2, 3 is 2.\n"


def parse_fault(text: str | None) -> tuple[str, str] | None:
    """``KIND:BUFT`` -> (kind, buffer type name); None for None/empty."""
    if not text:
        return None
    from specdec.errors import ConfigError
    from specdec.util.printable import printable

    kind, sep, buft = text.partition(":")
    if not sep or kind not in FAULTS or not buft:
        raise ConfigError(  # one line, not a traceback (a ValueError was)
            f"bad kernel fault {printable(repr(text), 100)} in $SPECDEC_TEST_KERNEL_FAULT: "
            f"KIND:BUFT with KIND one of {', '.join(FAULTS)}"
        )
    return kind, buft


def _act(kind: str) -> None:
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "ill":
        os.kill(os.getpid(), signal.SIGILL)
    elif kind == "abort":
        os.abort()
    elif kind == "hang":
        while True:
            time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.llama_trust.kernel_probe")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--choice", required=True)
    ap.add_argument("--listed", default="", help="the extra buffer types the parent sees")
    ap.add_argument("--fault", default=None)
    args = ap.parse_args(argv)
    choice = Choice.parse(args.choice)
    fault = parse_fault(args.fault)
    listed = tuple(b for b in args.listed.split(",") if b)

    import llama_cpp

    from specdec.llama_trust.llama_params import load_llama

    t0 = time.perf_counter()
    llm = load_llama(
        llama_cpp,
        args.model,
        choice,
        n_ctx=64,
        n_batch=64,
        n_threads=args.threads,
        logits_all=True,
    )
    load_s = time.perf_counter() - t0
    active = fault is not None and fault[1] in choice.in_use(listed)
    if active and fault is not None and fault[0] != "wrong":
        _act(fault[0])  # where a broken kernel dies: the first pass
    ids = list(llm.tokenize(_TEXT.encode(), add_bos=False, special=False))
    need = BATCH_ROWS + SINGLE_ROWS
    ids = [int(i) % llm.n_vocab() for i in (ids * (need // max(1, len(ids)) + 1))[:need]]
    t1 = time.perf_counter()
    llm.eval(ids[:BATCH_ROWS])  # one pass (n_batch 64 > BATCH_ROWS)
    for t in ids[BATCH_ROWS:]:
        llm.eval([t])
    pass_s = time.perf_counter() - t1
    logits = np.array(llm.scores[:need], dtype=np.float32)  # [need, V]
    if active:  # "wrong": what a kernel that computes garbage returns
        logits = np.random.default_rng(0).normal(0.0, 4.0, logits.shape).astype(np.float32)
    with open(args.out, "wb") as f:
        np.save(f, logits, allow_pickle=False)
    print(json.dumps({"ok": True, "load_s": round(load_s, 3), "pass_s": round(pass_s, 3)}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
