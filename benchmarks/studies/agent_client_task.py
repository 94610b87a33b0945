"""One task end to end through an agent client no one here wrote: the OpenAI Agents SDK
(``pip install openai-agents``, in a venv of its own) against a running ``specdec serve``: an
agent with a function tool is asked a question that needs the tool; the run must call the tool
and answer. It runs twice, once with each of the SDK's models: ``responses`` (its default,
``POST /v1/responses``) and ``chat`` (``OpenAIChatCompletionsModel``). The tool takes a nested
pydantic model, so its parameters carry ``$defs`` and a ``$ref`` as the SDK writes them.

    specdec serve --port 8765 &                       # the default pair
    /tmp/agents-venv/bin/python benchmarks/studies/agent_client_task.py --base http://127.0.0.1:8765/v1

Imports only the Agents SDK (not specdec). Prints the tool calls each run made and its answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--apis", default="responses,chat", help="the SDK models to run")
    ap.add_argument(
        "--tool-choice",
        default="required",
        help="the first turn's tool_choice (the SDK resets it to auto after a call); the 1.5B "
        "coder with auto answers in a JSON block instead of Qwen's tool-call format",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from importlib.metadata import version

    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI
    from pydantic import BaseModel

    class Place(BaseModel):
        city: str
        country: str

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.base, api_key="none", timeout=600)
    runs: list[dict[str, Any]] = []
    for api in args.apis.split(","):
        calls: list[str] = []

        def get_weather(place: Place) -> str:
            """The current weather in a place."""
            calls.append(f"{place.city}, {place.country}")  # noqa: B023 (each run's own list)
            return json.dumps({"city": place.city, "temp_c": 4, "sky": "cloudy"})

        # the SDK reads the hints; Place is local, so not as the strings this module writes
        get_weather.__annotations__ = {"place": Place, "return": str}
        tool = function_tool(get_weather)

        model: Any
        if api == "responses":
            model = OpenAIResponsesModel(model=args.model, openai_client=client)
        elif api == "chat":
            model = OpenAIChatCompletionsModel(model=args.model, openai_client=client)
        else:
            ap.error(f"--apis: responses and/or chat, got {api!r}")
        agent = Agent(
            name="weather",
            instructions="Answer with the weather tool's result.",
            tools=[tool],
            model=model,
            model_settings=ModelSettings(
                temperature=0, max_tokens=96, tool_choice=args.tool_choice
            ),
        )
        try:
            result = Runner.run_sync(agent, "What is the weather in Oslo right now?", max_turns=4)
            final, error = result.final_output, None
        except Exception as e:  # a failed run is a result here, reported with its error
            final, error = None, f"{type(e).__name__}: {e}"[:500]
        runs.append(
            {
                "api": api,
                "tool_calls": calls,
                "final_output": final,
                "error": error,
                "ok": bool(calls) and bool(final),
            }
        )
    out: dict[str, Any] = {
        "client": f"openai-agents {version('openai-agents')}",
        "model": args.model,
        "tool_choice": args.tool_choice,
        "runs": runs,
        "ok": all(r["ok"] for r in runs),
    }
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
