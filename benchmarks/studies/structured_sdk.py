"""The official openai client against ``specdec serve`` on the real default pair (issue 60's
"done when"): ``chat.completions.parse`` with a Pydantic model on 10 prompts (how many give a
valid object), and a tools round trip (call, tool result, final answer), not streamed and
streamed, with ``tool_choice`` auto (the model may answer without a call) and required.
Not a speed figure: it prints what each call returned.

    PYTHONPATH=src:tests /work/bin/cpu-heavy python benchmarks/studies/structured_sdk.py \\
        --out benchmarks/results/structured-sdk.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel


class Person(BaseModel):
    name: str
    born: int
    field: Literal["mathematics", "physics", "computing", "chemistry", "biology"]


PEOPLE = [
    "Ada Lovelace",
    "Alan Turing",
    "Marie Curie",
    "Grace Hopper",
    "Isaac Newton",
    "Emmy Noether",
    "Charles Darwin",
    "Rosalind Franklin",
    "John von Neumann",
    "Dorothy Hodgkin",
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def round_trip(client: Any, stream: bool, tool_choice: str) -> dict[str, Any]:
    """Call, tool result, final answer; the first request with ``tool_choice`` (``auto``: the
    model decides and its own format is parsed; ``required``: the constraint makes it call)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    ask = {"tools": [WEATHER], "tool_choice": tool_choice, "temperature": 0, "max_tokens": 96}
    if stream:
        with client.chat.completions.stream(model="specdec", messages=messages, **ask) as s:
            first = s.get_final_completion()
    else:
        first = client.chat.completions.create(model="specdec", messages=messages, **ask)
    msg = first.choices[0].message
    out: dict[str, Any] = {
        "finish_reason": first.choices[0].finish_reason,
        "calls": [(c.function.name, c.function.arguments) for c in msg.tool_calls or []],
    }
    if not msg.tool_calls:
        out["content"] = msg.content
        return out
    messages.append(
        {
            "role": "assistant",
            "content": msg.content,
            "tool_calls": [c.model_dump() for c in msg.tool_calls],
        }
    )
    for c in msg.tool_calls:
        messages.append(
            {"role": "tool", "tool_call_id": c.id, "content": '{"temp_c": 4, "sky": "cloudy"}'}
        )
    final = client.chat.completions.create(
        model="specdec", messages=messages, tools=[WEATHER], temperature=0, max_tokens=64
    )
    out["final_answer"] = final.choices[0].message.content
    out["final_finish_reason"] = final.choices[0].finish_reason
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import openai

    import specdec
    from serve_harness import running_server

    pair = specdec.load()
    res: dict[str, Any] = {"parse": [], "round_trip": {}}
    with running_server(pair, model_name="specdec") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=600)
        for who in PEOPLE:
            t0 = time.perf_counter()
            done = client.chat.completions.parse(
                model="specdec",
                messages=[{"role": "user", "content": f"Who was {who}? Answer in JSON."}],
                response_format=Person,
                temperature=0,
                max_tokens=96,
            )
            parsed = done.choices[0].message.parsed
            row = {
                "who": who,
                "valid": isinstance(parsed, Person),
                "object": parsed.model_dump() if parsed is not None else None,
                "seconds": time.perf_counter() - t0,
            }
            res["parse"].append(row)
            print(json.dumps(row), flush=True)
        for choice in ("auto", "required"):
            for stream in (False, True):
                name = f"{choice}, {'streamed' if stream else 'plain'}"
                res["round_trip"][name] = round_trip(client, stream, choice)
                print(json.dumps({name: res["round_trip"][name]}), flush=True)
    res["parse_valid"] = sum(r["valid"] for r in res["parse"])
    print(f"parse: {res['parse_valid']}/{len(PEOPLE)} valid objects")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
