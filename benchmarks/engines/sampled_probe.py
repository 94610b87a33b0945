"""A direct look at a spec-on server's sampled output, outside the certificate: one prompt,
12 tokens, temperature 1 (and 0.7), two seeds, with the sampling fields a client might send
(none, top_k 0, top_k -1, logprobs). Used on vLLM CPU 0.32.0 with the 0.5B draft, whose
certificate FAILed with sampled completions that read as random tokens: whether any request
field is the cause.

    .venv/bin/python benchmarks/engines/sampled_probe.py URL [--model NAME] > OUT.txt
"""

from __future__ import annotations

import argparse
import json
import urllib.request

PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively."
VARIANTS = [
    ("temperature 1", {}),
    ("top_k 0", {"top_k": 0}),
    ("top_k -1", {"top_k": -1}),
    ("top_p 1, logprobs 5", {"top_p": 1.0, "logprobs": 5}),
    ("temperature 0.7", {"temperature": 0.7}),
    ("temperature 0 (greedy)", {"temperature": 0.0}),
]


def complete(url: str, model: str, **fields: object) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, **fields}
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return str(json.load(r)["choices"][0]["text"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    a = ap.parse_args()
    print(f"server {a.url}, prompt {PROMPT!r}, 12 tokens")
    for name, fields in VARIANTS:
        for seed in (1, 2):
            text = complete(a.url, a.model, **fields, seed=seed)
            print(f"{name:24s} seed {seed}: {text!r}", flush=True)


if __name__ == "__main__":
    main()
