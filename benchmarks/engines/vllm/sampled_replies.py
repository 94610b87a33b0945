"""The spec-on sampled replies of an endpoint certificate, read from its ``progress.jsonl``
(which is not committed): one line per reply with its key, vLLM's per-request draft counters
and its text, then the acceptance over all of them.

    python benchmarks/engines/vllm/sampled_replies.py CERT_DIR > OUT.txt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cert", type=Path, help="the certificate's --out directory")
    a = ap.parse_args()
    plan: dict[str, object] = {}
    rows: dict[str, dict[str, object]] = {}
    with (a.cert / "progress.jsonl").open(encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "header":
                plan = rec["config"]["plan"]
            elif str(rec.get("key", "")).startswith("sampled:") and ":on:" in rec["key"]:
                rows[rec["key"]] = rec["value"]  # a resumed run's later copy wins
    print(f"# spec-on sampled replies of {a.cert.name} (from its progress.jsonl, not committed):")
    print(
        f"# key, drafted/accepted tokens (vLLM's per-request counters), text; temperature "
        f"{plan.get('temperature')}, {plan.get('sample_tokens')} tokens"
    )
    drafted = accepted = 0

    def order(key: str) -> tuple[int, int]:
        _, prompt, _, i = key.split(":")
        return int(prompt), int(i)

    for key in sorted(rows, key=order):
        v = rows[key]
        c = v.get("counters") or {}
        d, acc = c.get("drafted"), c.get("accepted")  # type: ignore[union-attr]
        drafted += d or 0
        accepted += acc or 0
        print(f"{key}\t{d}/{acc}\t{v['text']!r}")
    share = f"{accepted / drafted:.3f}" if drafted else "n/a"
    print(f"# {len(rows)} replies; drafted {drafted}, accepted {accepted} (acceptance {share})")


if __name__ == "__main__":
    main()
