"""One task end to end through an agent client no one here wrote: the OpenAI Agents SDK
(``pip install openai-agents``, in a venv of its own) against a running ``specdec serve``, with
its chat-completions model (specdec does not serve the Responses API yet): an agent with a
function tool is asked a question that needs the tool; the run must call the tool and answer.

    specdec serve --port 8765 &                       # the default pair
    /tmp/agents-venv/bin/python benchmarks/studies/agent_client_task.py --base http://127.0.0.1:8765/v1

Imports only the Agents SDK (not specdec). Prints the tool calls the run made and the answer.
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
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return json.dumps({"city": city, "temp_c": 4, "sky": "cloudy"})

    client = AsyncOpenAI(base_url=args.base, api_key="none", timeout=600)
    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool's result.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model=args.model, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=96),
    )
    result = Runner.run_sync(agent, "What is the weather in Oslo right now?", max_turns=4)
    out: dict[str, Any] = {
        "client": "openai-agents",
        "tool_calls": calls,
        "final_output": result.final_output,
        "ok": bool(calls) and bool(result.final_output),
    }
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
