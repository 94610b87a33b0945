"""The spec-on sampled replies of an endpoint certificate, read from its ``progress.jsonl``
(which is not committed): one line per reply with its key, vLLM's per-request draft counters
and its text, then the acceptance over all of them. With ``--against OTHER_DIR`` (a run of the
same plan, so the same seeds): the replies that drafted on either side, side by side.

    python benchmarks/engines/vllm/sampled_replies.py CERT_DIR > OUT.txt
    python benchmarks/engines/vllm/sampled_replies.py CERT_DIR --against FIXED_DIR > OUT.txt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read(cert: Path) -> tuple[dict[str, object], dict[str, dict[str, object]]]:
    """(the plan, the spec-on sampled replies by key)."""
    plan: dict[str, object] = {}
    rows: dict[str, dict[str, object]] = {}
    with (cert / "progress.jsonl").open(encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "header":
                plan = rec["config"]["plan"]
            elif str(rec.get("key", "")).startswith("sampled:") and ":on:" in rec["key"]:
                rows[rec["key"]] = rec["value"]  # a resumed run's later copy wins
    return plan, rows


def order(key: str) -> tuple[int, int]:
    _, prompt, _, i = key.split(":")
    return int(prompt), int(i)


def counts(v: dict[str, object]) -> tuple[int, int]:
    c = v.get("counters") or {}
    return int(c.get("drafted") or 0), int(c.get("accepted") or 0)  # type: ignore[union-attr]


def side_by_side(a: Path, b: Path) -> None:
    plan_a, rows_a = read(a)
    plan_b, rows_b = read(b)
    if plan_a != plan_b:
        raise SystemExit(f"{a} and {b} were run with different plans")
    print(f"# spec-on sampled replies that drafted, {a.name} | {b.name} (same plan, same seeds)")
    print("# key, drafted/accepted and text of each")
    shown = 0
    for key in sorted(set(rows_a) & set(rows_b), key=order):
        (da, aa), (db, ab) = counts(rows_a[key]), counts(rows_b[key])
        if da or db:
            shown += 1
            print(
                f"{key}\t{da}/{aa}\t{rows_a[key]['text']!r}\t|\t{db}/{ab}\t{rows_b[key]['text']!r}"
            )
    print(f"# {shown} of {len(set(rows_a) & set(rows_b))} replies drafted on either side")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cert", type=Path, help="the certificate's --out directory")
    ap.add_argument("--against", type=Path, help="a second run of the same plan")
    a = ap.parse_args()
    if a.against is not None:
        side_by_side(a.cert, a.against)
        return
    plan, rows = read(a.cert)
    print(f"# spec-on sampled replies of {a.cert.name} (from its progress.jsonl, not committed):")
    print(
        f"# key, drafted/accepted tokens (vLLM's per-request counters), text; temperature "
        f"{plan.get('temperature')}, {plan.get('sample_tokens')} tokens"
    )
    drafted = accepted = 0
    for key in sorted(rows, key=order):
        d, acc = counts(rows[key])
        drafted += d
        accepted += acc
        print(f"{key}\t{d}/{acc}\t{rows[key]['text']!r}")
    share = f"{accepted / drafted:.3f}" if drafted else "n/a"
    print(f"# {len(rows)} replies; drafted {drafted}, accepted {accepted} (acceptance {share})")


if __name__ == "__main__":
    main()
