"""`specdec serve` with no flags against llama.cpp's own server on the same GGUF, through the
OpenAI chat API as users call it: end to end (prefill included) and decode-only, interleaved,
on three request sets (issue 61, item 3).

Design, fixed before the run:

- Servers, all up at once, each pinned to the same CPUs with the same thread count, one
  request at a time in the whole run: llama-server without speculation (``off``, the plain
  reference) and with each of its n-gram speculation types at llama.cpp's defaults
  (``ngram-simple``, ``ngram-mod``, ``ngram-map-k``: what a user who names one gets), and
  ``specdec serve -m TARGET`` with no other flag (the default drafter; exact numerics as its
  first use decides). The edit and prose sets also send the text before the edit as OpenAI's
  ``prediction`` (``specdec+prediction``: llama-server has no such field) to a second
  ``specdec serve`` of its own: on the first server the same prompt would find its prefill
  in the prompt cache the plain arm just left (a first run did that: 0.1 s to the first token).
- Request sets (greedy, chat API, ``seed`` 0):
  ``fresh``: HumanEval functions to complete (nothing to copy but the signature), ``--fresh``
  of them drawn with seed 0, ``--fresh-tokens`` new tokens;
  ``edits``: code edits from the ``code_predict`` set (controls left out), ``--edits`` of them
  drawn with seed 0, ``--edit-tokens``;
  ``prose``: page edits of prose from the ``long_edit`` set (typos, a renamed name, a title),
  ``--prose`` of them, ``--prose-tokens`` (the first part of the page).
- Interleaving: for each request the order of the servers is rotated (request i starts at
  arm i mod n), so slow drift of the machine falls on all alike. Within a request the order
  is fixed, so each arm runs right after the same other one; ``--quiet-share`` makes every
  request wait until the others' CPU use has settled (``settle``).
- Measures, from the client's stream: end to end = completion tokens / seconds from sending
  to the last byte; decode-only = (completion tokens - 1) / seconds from the first content
  chunk to the last; time to the first token. Completion tokens from the final usage chunk
  (``stream_options.include_usage``). Ratios per request to llama-server ``off`` on the same
  request: with ``--rounds`` n, each arm's best of its n rounds against ``off``'s best (rounds
  with an output of another length than plain's left out); per set the geometric mean and
  the lowest.
- Editor loop (``--editor`` pairs, issue 61 item 4): the same file edited twice with another
  request between, as an editor sends them: A = the file, then an instruction (a rename);
  B = a fresh request (a HumanEval completion); C = the same file, then another instruction
  (type hints). Each engine gets A, B, C in turn (16 new tokens each; engines rotated per
  pair); reported: C's time to the first token over A's (issue 61: at most 0.25 for specdec),
  beside llama-server's (its own prompt cache).
- Verdicts (issue 61's done-when lines, fixed before the run): on ``edits`` specdec's default
  geo-mean end to end >= the best llama-server n-gram type's; on ``fresh`` every request
  >= 0.97x llama-server ``off`` end to end.
- Every request is appended (fsynced) to ``--out`` as it finishes; ``--resume`` keeps those
  already there, so a crash loses at most one. ``--report FILE`` prints the table again.

    .venv/bin/python benchmarks/vs_llama_server.py --out benchmarks/results/vs-llama-server.jsonl
    .venv/bin/python benchmarks/vs_llama_server.py --report benchmarks/results/vs-llama-server.jsonl

Needs llama-server from ``benchmarks/engines/build_llama_server.sh`` and the target in the
store (``specdec models fetch qwen2.5-coder-1.5b-instruct-q4_k_m``). Time it only on a quiet
machine: nothing else heavy may run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent / "engines"))
import servers as S

from specdec.prompt_sets import (
    Prompt,
    load_code_completion,
    load_code_predict,
    load_long_edit,
    sample_per_category,
)
from specdec.util.machine import machine_info

OUT = S.REPO / "benchmarks/results/vs-llama-server.jsonl"
NAME = "qwen2.5-coder-1.5b"
LLAMA_TYPES = ("ngram-simple", "ngram-mod", "ngram-map-k")
PREDICTION = "specdec+prediction"
FLOOR_EACH = 0.97  # issue 61: no fresh-code request below this fraction of plain llama-server
FRESH_ASK = "Complete this Python function. Reply with the whole function in a code block.\n\n"
PROSE_KINDS = ("typos", "rename_name", "add_title")


def request_sets(n_fresh: int, n_edits: int, n_prose: int) -> dict[str, list[Prompt]]:
    """The three sets, drawn with seed 0 (the same lists every run)."""
    fresh = sample_per_category(load_code_completion(), n_fresh, seed=0)
    edits = [p for p in load_code_predict() if not p.fine_category.startswith("control")]
    edits = sample_per_category(edits, n_edits, seed=0)
    prose = [p for p in load_long_edit() if p.fine_category in PROSE_KINDS][:n_prose]
    return {"fresh": fresh, "edits": edits, "prose": prose}


def editor_pairs(n: int) -> list[tuple[Prompt, Prompt, Prompt]]:
    """(A, B, C) per pair: two edits of one file (rename_i, type_hints_i of ``code_predict``)
    and a fresh request between them; the file first in each edit, then the instruction."""
    tasks = {p.id.split(":", 1)[1]: p for p in load_code_predict()}
    fresh = load_code_completion()[-n:]  # the last HumanEval prompts: any other request
    out = []
    for i in range(1, n + 1):
        a, c = tasks[f"rename_{i}"], tasks[f"type_hints_{i}"]
        out.append((file_first(a), fresh[i - 1], file_first(c)))
    return out


def file_first(p: Prompt) -> Prompt:
    instruction, code = p.text.split("\n\n", 1)
    return Prompt(p.id, f"{code}\n\n{instruction}", p.category, p.fine_category)


def run_editor(
    args: argparse.Namespace,
    by_arm: dict[str, S.ServerSpec],
    f: Any,
    done: set[tuple[Any, ...]],
    machine: dict[str, Any],
) -> None:
    arms = ["off", "specdec"]
    for i, triple in enumerate(editor_pairs(args.editor)):
        for arm in arms[i % 2 :] + arms[: i % 2]:
            if (0, "editor", triple[0].id, arm) in done:
                continue
            row: dict[str, Any] = {"round": 0, "set": "editor", "id": triple[0].id, "arm": arm}
            for step, p in zip("ABC", triple, strict=True):
                text = message("fresh" if step == "B" else "edits", p)
                got = ask(by_arm[arm].url, text, 16, None)
                row[f"ttft_{step}"] = got["ttft_s"]
                row[f"prompt_tokens_{step}"] = got["prompt_tokens"]
            row["machine"] = machine
            append(f, row)
            print(
                f"editor {triple[0].id:12} {arm:8} TTFT A {row['ttft_A']:.2f} s, "
                f"C {row['ttft_C']:.2f} s",
                flush=True,
            )


def append(f: Any, row: dict[str, Any]) -> None:
    """One result line, on disk before the next request (a crash loses at most that one)."""
    f.write(json.dumps(row) + "\n")
    f.flush()
    os.fsync(f.fileno())


def message(set_name: str, p: Prompt) -> str:
    return FRESH_ASK + f"```python\n{p.text}```" if set_name == "fresh" else p.text


def arms_for(set_name: str) -> list[str]:
    arms = ["off", *LLAMA_TYPES, "specdec"]
    return arms + ([PREDICTION] if set_name != "fresh" else [])


def settle(quiet_share: float, most_s: float = 10.0, window_s: float = 0.25) -> float:
    """Wait until the machine is quiet: a ``window_s`` window in which other processes (the
    servers finishing their last request's work) used at most ``quiet_share`` of all cores,
    or ``most_s`` seconds; the seconds waited. Every timed request starts from the same
    quiet state, whichever server ran before it (the rotation puts each arm behind a fixed
    other one)."""
    from specdec.util import cpuload

    t0 = time.monotonic()
    while time.monotonic() - t0 < most_s:
        before = cpuload.sample()
        time.sleep(window_s)
        share = cpuload.others_share(before, cpuload.sample())
        if share is None or share <= quiet_share:
            break
    return time.monotonic() - t0


def ask(base: str, text: str, max_tokens: int, prediction: str | None) -> dict[str, Any]:
    """One streamed chat request; the client-side clock of each part."""
    body: dict[str, Any] = {
        "model": NAME,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    parts: list[str] = []
    usage: dict[str, Any] = {}
    first = last = None
    t0 = time.perf_counter()
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json=body, timeout=600, trust_env=False
    ) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = now if first is None else first
                    last = now
                    parts.append(piece)
    end = time.perf_counter()
    n = int(usage.get("completion_tokens") or 0)
    if n < 2 or first is None or last is None or last <= first:
        raise RuntimeError(f"{base}: a reply of {n} tokens cannot be timed")
    details = usage.get("completion_tokens_details") or {}
    return {
        "tokens": n,
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "e2e_s": end - t0,
        "ttft_s": first - t0,
        "decode_s": last - first,
        "e2e_tps": n / (end - t0),
        "decode_tps": (n - 1) / (last - first),
        "accepted_prediction_tokens": details.get("accepted_prediction_tokens"),
        "text": "".join(parts),
    }


def specs(port0: int, cpus: str, root: Path) -> dict[str, S.ServerSpec]:
    out = {}
    for i, mode in enumerate(("off", *LLAMA_TYPES)):
        out[mode] = S.llama_server(mode, port0 + i, root=root, cpus=cpus, ctx_per_slot=4096)
    threads = str(len(S._cpu_list(cpus)))

    def serve(name: str, port: int) -> S.ServerSpec:
        argv = [str(Path(sys.executable).parent / "specdec"), "serve", "-m", S.TARGET]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--threads", threads]
        argv += ["--served-model-name", NAME]
        return S.ServerSpec(name, argv, port, cpus=cpus, start_timeout_s=900)

    out["specdec"] = serve("specdec-serve-default", port0 + 9)
    out[PREDICTION] = serve("specdec-serve-prediction", port0 + 10)
    return out


def load_done(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: that request runs again
    return rows


def run(args: argparse.Namespace) -> None:
    sets = request_sets(args.fresh, args.edits, args.prose)
    tokens = {"fresh": args.fresh_tokens, "edits": args.edit_tokens, "prose": args.prose_tokens}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = (
        {(r["round"], r["set"], r["id"], r["arm"]) for r in load_done(out)}
        if args.resume
        else set()
    )
    if not args.resume and out.exists():
        out.unlink()
    machine = machine_info()
    by_arm = specs(args.port, args.cpus, Path(args.root))
    item = 0
    for rnd in range(args.rounds):
        # fresh servers each round: a second round on the same servers measured their
        # memory of the first (llama-server's prompt cache answered in 0.07 s, ngram-mod's
        # pool drafted the answers it had seen), not the requests
        with S.running(list(by_arm.values()), Path(args.log_dir)), out.open("a") as f:
            for set_name in args.sets.split(","):
                for p in sets[set_name]:
                    arms = arms_for(set_name)
                    start = item % len(arms)
                    item += 1
                    for arm in arms[start:] + arms[:start]:
                        if (rnd, set_name, p.id, arm) in done:
                            continue
                        spec = by_arm[arm]
                        pred = p.prediction if arm == PREDICTION else None
                        waited = settle(args.quiet_share) if args.quiet_share < 1 else 0.0
                        got = ask(spec.url, message(set_name, p), tokens[set_name], pred)
                        got["settle_s"] = round(waited, 3)
                        row = {
                            "round": rnd,
                            "set": set_name,
                            "id": p.id,
                            "arm": arm,
                            **got,
                            "machine": machine,
                        }
                        append(f, row)
                        print(
                            f"{rnd} {set_name:6} {p.id:28} {arm:20} {got['e2e_tps']:6.1f} "
                            f"tok/s e2e {got['decode_tps']:6.1f} decode",
                            flush=True,
                        )
    if args.editor:
        with S.running(list(by_arm.values()), Path(args.log_dir)), out.open("a") as f:
            run_editor(args, by_arm, f, done, machine)


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def per_request(pairs: list[tuple[dict[str, Any], dict[str, Any]]], key: str) -> list[float]:
    """Per request, the arm's best ``key`` over the rounds against plain's best over the same
    rounds (best of the interleaved rounds: a spike of another process's load on one round
    does not decide a request's ratio)."""
    best: dict[str, list[float]] = {}
    for a, b in pairs:
        mine, ref = best.setdefault(a["id"], [0.0, 0.0])
        best[a["id"]] = [max(mine, a[key]), max(ref, b[key])]
    return [mine / ref for mine, ref in best.values()]


def report(path: Path) -> str:
    """The table: per set and arm, geo-mean and lowest ratio to llama-server off (end to end
    and decode-only), identical outputs to it, and the two verdicts."""
    rows = load_done(path)
    if not rows:
        raise SystemExit(f"no results in {path}")
    ref = {(r["round"], r["set"], r["id"]): r for r in rows if r["arm"] == "off" and "e2e_tps" in r}
    lines = [f"machine: {rows[0].get('machine', {})}", ""]
    lines.append(
        "| set | arm | request rounds (same length as plain) | end to end (geo-mean, lowest) | "
        "decode-only "
        "(geo-mean, lowest) | TTFT (median s) | same text as plain |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    geo: dict[tuple[str, str], float] = {}
    lows: dict[tuple[str, str], float] = {}
    for set_name in ("fresh", "edits", "prose"):
        for arm in ("off", *LLAMA_TYPES, "specdec", PREDICTION):
            mine = [r for r in rows if r["set"] == set_name and r["arm"] == arm and "e2e_tps" in r]
            pairs = [
                (r, ref[(r["round"], r["set"], r["id"])])
                for r in mine
                if (r["round"], r["set"], r["id"]) in ref
            ]
            if not pairs:
                continue
            n_all = len(pairs)
            # tokens/s of outputs of different lengths are not comparable end to end (a
            # 13-token answer is mostly prefill, a 22-token one less so): left out, counted
            pairs = [(a, b) for a, b in pairs if a["tokens"] == b["tokens"]]
            if not pairs:
                continue
            e2e, dec = per_request(pairs, "e2e_tps"), per_request(pairs, "decode_tps")
            ttft = sorted(a["ttft_s"] for a, _ in pairs)[len(pairs) // 2]
            same = sum(a["text"] == b["text"] for a, b in pairs)
            geo[(set_name, arm)], lows[(set_name, arm)] = geomean(e2e), min(e2e)
            lines.append(
                f"| {set_name} | {arm} | {len(pairs)} of {n_all} | "
                f"{geomean(e2e):.2f}x, {min(e2e):.2f}x | "
                f"{geomean(dec):.2f}x, {min(dec):.2f}x | {ttft:.2f} | {same}/{len(pairs)} |"
            )
    editor = [r for r in rows if r["set"] == "editor"]
    if editor:
        lines += [
            "",
            "| editor loop | pairs | TTFT A (median s) | TTFT C (median s) | C / A (each pair) |",
            "|---|---|---|---|---|",
        ]
        for arm in ("off", "specdec"):
            mine = [r for r in editor if r["arm"] == arm]
            if not mine:
                continue
            ratios = ", ".join(f"{r['ttft_C'] / r['ttft_A']:.2f}" for r in mine)
            med_a = sorted(r["ttft_A"] for r in mine)[len(mine) // 2]
            med_c = sorted(r["ttft_C"] for r in mine)[len(mine) // 2]
            lines.append(f"| {arm} | {len(mine)} | {med_a:.2f} | {med_c:.2f} | {ratios} |")
    lines.append("")
    best = max((geo.get(("edits", t), 0.0), t) for t in LLAMA_TYPES)
    if ("edits", "specdec") in geo:
        ok = geo[("edits", "specdec")] >= best[0]
        lines.append(
            f"edits: specdec's default {geo[('edits', 'specdec')]:.2f}x against llama-server's "
            f"best n-gram type ({best[1]}) {best[0]:.2f}x: {'PASS' if ok else 'FAIL'}"
        )
    spec_editor = [r["ttft_C"] / r["ttft_A"] for r in editor if r["arm"] == "specdec"]
    if spec_editor:
        worst = max(spec_editor)
        lines.append(
            f"editor loop: specdec's second edit of a file at most {worst:.2f} of the first's "
            f"time to the first token (issue 61: <= 0.25): {'PASS' if worst <= 0.25 else 'FAIL'}"
        )
    if ("fresh", "specdec") in lows:
        low = lows[("fresh", "specdec")]
        lines.append(
            f"fresh: specdec's default lowest request {low:.2f}x plain llama-server end to end "
            f"(floor {FLOOR_EACH}): {'PASS' if low >= FLOOR_EACH else 'FAIL'}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--report", help="print the table of a results file and stop")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument(
        "--quiet-share",
        type=float,
        default=1.0,
        help="before each request wait (10 s at most) until other processes use at most this "
        "share of the cores over 0.25 s (1: no wait, as the committed runs)",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sets", default="fresh,edits,prose")
    ap.add_argument("--fresh", type=int, default=20)
    ap.add_argument("--edits", type=int, default=8)
    ap.add_argument("--prose", type=int, default=4)
    ap.add_argument("--fresh-tokens", type=int, default=128)
    ap.add_argument("--edit-tokens", type=int, default=256)
    ap.add_argument("--prose-tokens", type=int, default=192)
    ap.add_argument("--editor", type=int, default=4, help="editor-loop pairs (0: none)")
    ap.add_argument("--cpus", default="0-1")
    ap.add_argument("--port", type=int, default=18300)
    ap.add_argument("--root", default=str(S.DEFAULT_ROOT), help="the engines root")
    ap.add_argument("--log-dir", default="/tmp/specdec-vs-llama-server-logs")
    args = ap.parse_args()
    if not 0 <= args.quiet_share <= 1:
        ap.error(f"--quiet-share: a share of the cores in [0, 1], got {args.quiet_share}")
    # a plain kill ends the run as Ctrl-C does: the servers it started are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report:
        print(report(Path(args.report)))
        return
    run(args)
    print(report(Path(args.out)))


if __name__ == "__main__":
    main()
