"""`specdec serve` with no flags answers the same text with speculation on and off.

Starts ``specdec serve`` exactly as a user would (no flags: the default target, the default
drafter, numerics as this machine's first-use measurement decides, ``configuration``) and
sends every prompt twice through the OpenAI API, greedy: once as it is (speculation on) and
once with ``speculative: {"n_max": 0}`` (plain decoding on the same loaded target), each
alternately first. The prompts: chat requests of the Spec-Bench and HumanEval sets and code
edits with the code as ``prediction``. Per prompt it records both texts, whether they are
equal, the speculative statistics of ``usage`` and which numerics the server reported at
start; one JSON line per prompt is appended to ``--out`` as it completes (``--resume`` keeps
those already there). The summary line counts identical answers.

    python benchmarks/serve_exact_identity.py --out benchmarks/results/serve-exact-identity.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


def prompts(n_chat: int, n_edits: int) -> list[dict[str, Any]]:
    """Chat prompts (Spec-Bench per category, HumanEval) and code edits with predictions."""
    from specdec.prompt_sets import (
        load_code_completion,
        load_code_predict,
        load_spec_bench,
        sample_per_category,
    )

    spec = sample_per_category(load_spec_bench(), 1, seed=7)[:n_chat]
    out = [{"id": p.id, "text": p.text, "prediction": None} for p in spec]
    out += [{"id": p.id, "text": p.text, "prediction": None} for p in load_code_completion()[:2]]
    for p in load_code_predict()[:n_edits]:
        out.append({"id": p.id, "text": p.text, "prediction": p.prediction})
    return out


def served_model(url: str) -> str:
    """The model name the server at ``url`` serves (its /v1/models): requests must name it."""
    r = httpx.get(url + "/v1/models", timeout=30, trust_env=False)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


def ask(url: str, item: dict[str, Any], n_new: int, spec_on: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": served_model(url),
        "messages": [{"role": "user", "content": item["text"]}],
        "max_tokens": n_new,
        "temperature": 0,
    }
    if item["prediction"] is not None:
        body["prediction"] = {"type": "content", "content": item["prediction"]}
    if not spec_on:
        body["speculative"] = {"n_max": 0}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600, trust_env=False)
    r.raise_for_status()
    data = r.json()
    return {
        "text": data["choices"][0]["message"]["content"],
        "seconds": time.perf_counter() - t0,
        "usage": data.get("usage", {}),
    }


def start_serve(flags: list[str], port: int, log_path: Path, timeout_s: float = 900) -> Any:
    """``specdec serve`` with ``flags`` on 127.0.0.1:``port``, its output in ``log_path``,
    once it answers /health (exits naming the log where it does not)."""
    url = f"http://127.0.0.1:{port}"
    specdec = str(Path(sys.executable).parent / "specdec")
    cmd = [specdec, "serve", "--host", "127.0.0.1", "--port", str(port), *flags]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            sys.exit(f"specdec serve exited with {proc.returncode}: see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=5, trust_env=False).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"specdec serve did not answer within {timeout_s:.0f} s")
        time.sleep(2)


def stop(proc: Any) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--chat", type=int, default=8, help="Spec-Bench prompts, one per category")
    ap.add_argument("--edits", type=int, default=4, help="code edits with their predictions")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.resume:
        sys.exit(f"{args.out} exists: --resume to continue it, or remove it")
    done = set()
    if args.out.exists():
        done = {json.loads(x)["id"] for x in args.out.read_text().splitlines() if x.strip()}
    url = f"http://127.0.0.1:{args.port}"
    log_path = args.out.with_suffix(".server.log")
    proc = start_serve([], args.port, log_path)
    try:
        started = log_path.read_text(errors="replace")
        numerics = [ln for ln in started.splitlines() if "exact numerics" in ln]
        for i, item in enumerate(prompts(args.chat, args.edits)):
            if item["id"] in done:
                continue
            order = (True, False) if i % 2 == 0 else (False, True)
            runs = {("on" if on else "off"): ask(url, item, args.new_tokens, on) for on in order}
            rec = {
                "id": item["id"],
                "prediction": item["prediction"] is not None,
                "identical": runs["on"]["text"] == runs["off"]["text"],
                "numerics": numerics[-1] if numerics else None,
                "runs": runs,
            }
            with args.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"{item['id']}: {'identical' if rec['identical'] else 'DIFFERENT'}", flush=True)
    finally:
        stop(proc)
    records = [json.loads(x) for x in args.out.read_text().splitlines() if x.strip()]
    same = sum(r["identical"] for r in records)
    print(
        f"{same}/{len(records)} answers identical with speculation on and off "
        f"({sum(r['prediction'] for r in records)} with a prediction); "
        f"numerics: {records[0]['numerics'] if records else '?'}"
    )
    return 0 if same == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
