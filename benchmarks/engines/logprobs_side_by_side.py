"""What llama-server and `specdec serve` return for the log-probabilities of drafted tokens:
the same greedy completions request (a prompt the n-gram lookup can copy from, 48 tokens,
``logprobs: 5``) to each server with speculation on and off, on the same GGUF (the 1.5B
Q4_K_M target).

- llama-server: ``--spec-type ngram-simple`` (3-token lookup, 4 drafts) against the same server
  without speculation (two servers, one after the other);
- ``specdec serve --draft ngram -k 4`` (prompt lookup), spec-off through its per-request
  switch (``speculative.n_max: 0``), with llama.cpp's numerics (``--no-exact``, as
  llama-server's) and with exact numerics (``--exact``).

For each server: the tokens whose logprob is exactly 0.0 with no alternatives (what llama.cpp
issue 27972 describes for drafted tokens), the largest |difference| between the spec-on and
spec-off logprob of the same token at the same position (over the common prefix of the two
outputs), the shape of the ``logprobs`` block (completions' ``token_logprobs`` or chat's
``content``), and the drafted / accepted counts where the server reports them.

    PYTHONPATH=src .venv/bin/python benchmarks/engines/logprobs_side_by_side.py [--root DIR]

Results: benchmarks/results/engines/logprobs-side-by-side.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx
import servers as S

PROMPT = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    return a / b\n\n\n"
    "def add3(a, b, c):\n    return a + b + c\n\n\n"
)
N_TOKENS = 48


def ask(url: str, extra: dict[str, Any]) -> dict[str, Any]:
    body = {
        "model": "qwen2.5-coder-1.5b",
        "prompt": PROMPT,
        "max_tokens": N_TOKENS,
        "temperature": 0.0,
        "logprobs": 5,
        "top_k": 0,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "cache_prompt": False,
        **extra,
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=600, trust_env=False)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def tokens_of(reply: dict[str, Any]) -> tuple[str, list[tuple[str, float, int]]]:
    """The reply's logprobs block shape, and per token (text, logprob, alternatives)."""
    lp = reply["choices"][0].get("logprobs") or {}
    if "content" in lp:  # chat shape, even on /v1/completions (llama-server)
        return "content (chat shape)", [
            (c["token"], c["logprob"], len(c.get("top_logprobs") or [])) for c in lp["content"]
        ]
    if "token_logprobs" in lp:
        return "token_logprobs (completions shape)", [
            (t, v, len(top or {}))
            for t, v, top in zip(
                lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
            )
        ]
    return "none", []


def compare(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    shape, t_on = tokens_of(on)
    _, t_off = tokens_of(off)
    common = 0
    for a, b in zip(t_on, t_off, strict=False):
        if a[0] != b[0]:
            break
        common += 1
    diffs = [abs(t_on[i][1] - t_off[i][1]) for i in range(common)]
    usage = on.get("usage") or {}
    timings = on.get("timings") or {}
    return {
        "shape": shape,
        "tokens_on": len(t_on),
        "text_equal": on["choices"][0]["text"] == off["choices"][0]["text"],
        "common_prefix": common,
        "zero_logprob_no_alternatives_on": sum(1 for _, v, n in t_on if v == 0.0 and n == 0),
        "zero_logprob_no_alternatives_off": sum(1 for _, v, n in t_off if v == 0.0 and n == 0),
        "max_abs_diff_on_off": max(diffs, default=None),
        "positions_differing": sum(1 for d in diffs if d != 0.0),
        "drafted": usage.get("drafted_tokens", timings.get("draft_n")),
        "accepted": usage.get("accepted_tokens", timings.get("draft_n_accepted")),
        "first_tokens_on": t_on[:12],
        "first_tokens_off": t_off[:12],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=S.DEFAULT_ROOT)
    ap.add_argument("--out", type=Path, default=S.REPO / "benchmarks/results/engines")
    a = ap.parse_args()
    logs = a.out / "logs-logprobs"
    got: dict[str, Any] = {"prompt": PROMPT, "max_tokens": N_TOKENS, "when": time.ctime()}
    replies: dict[str, dict[str, Any]] = {}
    for mode in ("ngram", "off"):
        spec = S.llama_server(mode, 18250, root=a.root)
        with S.running([spec], logs):
            replies[f"llama-server-{mode}"] = ask(spec.url, {})
    for numerics in ("no-exact", "exact"):
        spec = S.specdec_serve(
            18251, draft="ngram", name=f"specdec-serve-ngram-{numerics}", extra=[f"--{numerics}"]
        )
        with S.running([spec], logs):
            replies[f"specdec-{numerics}-on"] = ask(spec.url, {})
            replies[f"specdec-{numerics}-off"] = ask(spec.url, {"speculative": {"n_max": 0}})
    got["llama-server"] = compare(replies["llama-server-ngram"], replies["llama-server-off"])
    for numerics in ("no-exact", "exact"):
        got[f"specdec serve --{numerics}"] = compare(
            replies[f"specdec-{numerics}-on"], replies[f"specdec-{numerics}-off"]
        )
    got["replies"] = replies
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "logprobs-side-by-side.json").write_text(json.dumps(got, indent=1) + "\n")
    lines = [
        "# Log-probabilities of drafted tokens: llama-server vs specdec serve",
        "",
        f"One greedy `/v1/completions` request, {N_TOKENS} tokens, `logprobs: 5`, a prompt of "
        "repeated Python functions (the n-gram lookup copies from it), "
        "qwen2.5-coder-1.5b-instruct-q4_k_m; each server with n-gram speculation and without.",
        "",
        "| | llama-server `--spec-type ngram-simple` | specdec serve `--draft ngram -k 4 "
        "--no-exact` (llama.cpp's numerics) | the same, `--exact` |",
        "|---|---|---|---|",
    ]
    ls, sd, sx = (
        got["llama-server"],
        got["specdec serve --no-exact"],
        got["specdec serve --exact"],
    )
    for key, label in [
        ("shape", "logprobs block on /v1/completions"),
        ("drafted", "drafted / accepted (spec-on)"),
        ("zero_logprob_no_alternatives_on", "tokens with logprob 0.0 and no alternatives, spec-on"),
        ("zero_logprob_no_alternatives_off", "the same, spec-off"),
        ("text_equal", "spec-on text = spec-off text"),
        ("max_abs_diff_on_off", "max |logprob on - off|, same token and position"),
        ("positions_differing", "positions whose logprob differs on vs off"),
    ]:

        def cell(d: dict[str, Any], key: str = key) -> str:
            if key == "drafted":
                return f"{d['drafted']} / {d['accepted']}"
            return str(d[key])

        lines.append(f"| {label} | {cell(ls)} | {cell(sd)} | {cell(sx)} |")
    (a.out / "logprobs-side-by-side.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
