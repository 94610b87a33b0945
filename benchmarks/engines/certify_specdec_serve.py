"""`specdec certify --endpoint` against `specdec serve` itself: one server with the default
pair (the 1.5B target, the 0.5B draft model, K = 4), spec-off requests through its per-request
switch (``speculative.n_max = 0``, verified by its draft counters), the completions API so
that every test runs (greedy agreement with logprobs for near-ties, the sampled two-sample
tests, the per-token test through /tokenize, token ids and prompt_logprobs).

    PYTHONPATH=src .venv/bin/python benchmarks/engines/certify_specdec_serve.py \\
        [--exact] [--plan quick|budget:M] [--out DIR]

Results: OUT/specdec-serve/certify-{default,exact}-quick/ (the certificate) and a log beside
it with the machine, its load before and after, the commands and what they printed.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import servers as S
from run_engine import CERTIFY_BUDGET, SPECDEC, Log

PORT = 18230


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--exact", action="store_true", help="the server's --exact numerics (else --no-exact)"
    )
    ap.add_argument("--plan", default="quick", help="quick (specdec's) or budget:MINUTES")
    ap.add_argument("--out", type=Path, default=S.REPO / "benchmarks/results/engines")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    numerics = "exact" if a.exact else "default"
    plan_name = a.plan.replace(":", "")
    out = a.out / "specdec-serve"
    name = f"certify-{numerics}-{plan_name}"
    log = Log(out / f"{name}.log")
    log.machine()
    flag = "--exact" if a.exact else "--no-exact"  # llama.cpp's own numerics, said explicitly
    spec = S.specdec_serve(PORT, extra=[flag], name=f"serve-{numerics}")
    log.servers([spec])
    if a.plan == "quick":
        plan = ["--quick"]
    else:
        plan = [*CERTIFY_BUDGET, "--max-minutes", a.plan.split(":", 1)[1]]
    with S.running([spec], out / "logs"):
        log.load("before")
        rc = log.run(
            [
                SPECDEC,
                "certify",
                "--endpoint",
                spec.url,
                "--endpoint-api",
                "completions",
                *plan,
                "--out",
                str(out / name),
            ]
        )
        log.load("after")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
