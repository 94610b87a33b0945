"""What a huge, repetitive prediction costs a request (issue 42, item 3): a 3.98 MB
prediction of a periodic text against plain decoding and the default drafter, on one loaded
pair, 256 new tokens of a raw prompt that continues the same period. Before the bounded
re-sync index (commit e89655b) every round scanned the whole prediction: 85.8 s instead of
1.9 s. The time includes the prediction's tokenization and its index's one build.

    PYTHONPATH=src python benchmarks/studies/long_prediction.py \\
        [--target smollm2-135m-instruct-q4_1]
"""

from __future__ import annotations

import argparse
import time

import specdec
from specdec.util.machine import machine_line

PERIOD = "the cat sat on the mat. "
SIZE = 3_980_000  # characters (ASCII: bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct-q4_1")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    text = (PERIOD * (SIZE // len(PERIOD) + 1))[:SIZE]
    pair = specdec.load(args.target, draft="planned", n_threads=args.threads)
    prompt = PERIOD * 4
    pair.generate(prompt, max_new_tokens=16, raw=True)  # warm-up: costs measured, caches
    pair.generate(prompt, max_new_tokens=16, raw=True, prediction=PERIOD)
    runs: list[tuple[str, dict]] = [
        ("plain (k=0)", {"k": 0}),
        ("default drafter, no prediction", {}),
        (f"prediction of {SIZE / 1e6:.2f} MB", {"prediction": text}),
    ]
    print(machine_line())
    plain_s = None
    for name, kw in runs:
        t0 = time.perf_counter()
        done = pair.generate(prompt, max_new_tokens=args.new_tokens, raw=True, **kw)
        s = time.perf_counter() - t0
        plain_s = plain_s or s
        extra = ""
        if "prediction" in kw:
            acc, rej = done.result.prediction_tokens()
            extra = f"; prediction tokens accepted {acc}, rejected {rej}"
        print(
            f"{name}: {s:.2f} s for {len(done.result.tokens)} tokens, {s / plain_s:.2f}x plain's "
            f"time{extra}"
        )


if __name__ == "__main__":
    main()
