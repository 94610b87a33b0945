"""The endpoint plugin (``vllm.endpoint_plugins`` entry point ``specdec_prediction``): OpenAI's
``prediction`` on ``/v1/chat/completions`` and ``/v1/completions``.

vLLM's request models accept unknown fields and drop them (``OpenAIBaseModel``: ``extra =
"allow"``, logged as ignored), so ``prediction`` never reaches the engine by itself. This
plugin replaces the two routes (vLLM lets an endpoint plugin replace a route with the same
path and method, ``vllm/plugins/endpoint_plugins/interface.py``) by ones that:

1. check the prediction (OpenAI's shape, UTF-8 text, fields it cannot go with) and tokenize
   it as text (special-token text stays characters), refusing one longer than the model's
   window: a 400 in vLLM's error format, naming the field;
2. put its token ids into the request's ``vllm_xargs`` (vLLM's documented way to carry data to
   custom extensions: it becomes ``SamplingParams.extra_args``), where the proposer
   (``proposer.PredictionProposer``) reads them;
3. call vLLM's own route function, unchanged;
4. write OpenAI's ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` into
   ``usage.completion_tokens_details`` of the reply (the final usage chunk when streamed),
   from vLLM's per-request speculative counters (``metrics.speculative_decoding``, which the
   server reports with ``--per-request-spec-decode-metrics summary``).

The server refuses to start with this plugin unless its speculative config uses the
proposer and the per-request counters are on (the counts would be missing otherwise).
"""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import State
from vllm.entrypoints.openai.chat_completion import api_router as chat_api
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion import api_router as completion_api
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.entrypoints.serve.utils.api_utils import validate_json_request
from vllm.logger import init_logger

from specdec_vllm.proposer import CLASS_PATH
from specdec_vllm.wire import (
    XARG,
    PredictionError,
    add_usage,
    check_length,
    check_request,
    prediction_text,
    rewrite_sse,
)

logger = init_logger("vllm.specdec_vllm.endpoint")
NAME = "specdec_prediction"
MARKER = "specdec_vllm: OpenAI prediction on /v1/chat/completions and /v1/completions"


@dataclass
class Checker:
    """What the routes need: the server's tokenizer and window."""

    tokenizer: Any
    window: int

    def encode(self, text: str) -> list[int]:
        """The prediction as token ids, its text as text (no special token parsed)."""
        out = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return list(out["input_ids"])


router = APIRouter()


def _refusal(e: PredictionError) -> JSONResponse:
    err = create_error_response(str(e), param=e.param)
    return JSONResponse(content=err.model_dump(), status_code=err.error.code)


async def _prepare(request: Any, raw_request: Request) -> JSONResponse | bool:
    """Check the request's prediction and hand its token ids to the engine; a 400 response,
    or whether the request has a prediction."""
    extra = request.model_extra or {}
    value = extra.get("prediction")
    try:
        check_request({"vllm_xargs": request.vllm_xargs})
        if value is None:
            return False
        check_request(
            {
                "n": request.n,
                "use_beam_search": getattr(request, "use_beam_search", False),
                "prompt": getattr(request, "prompt", None),
            }
        )
        text = prediction_text(value)
        checker: Checker = raw_request.app.state.specdec_prediction
        ids = await asyncio.get_running_loop().run_in_executor(None, checker.encode, text)
        check_length(len(ids), checker.window)
    except PredictionError as e:
        return _refusal(e)
    request.vllm_xargs = {**(request.vllm_xargs or {}), XARG: ids}
    return True


async def _finish(response: Any, predicted: bool) -> Any:
    """vLLM's reply with OpenAI's prediction counts in its usage."""
    if isinstance(response, StreamingResponse):
        inner = response.body_iterator

        async def counted() -> AsyncIterator[Any]:
            async for item in inner:
                yield rewrite_sse(item, predicted) if isinstance(item, str | bytes) else item

        response.body_iterator = counted()
        return response
    if isinstance(response, JSONResponse) and response.status_code == 200:
        body = json.loads(bytes(response.body))
        if isinstance(body, dict) and add_usage(body, predicted):
            headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
            return JSONResponse(content=body, status_code=200, headers=headers)
    return response


@router.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)])
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Any:
    prepared = await _prepare(request, raw_request)
    if isinstance(prepared, Response):
        return prepared
    return await _finish(await chat_api.create_chat_completion(request, raw_request), prepared)


@router.post("/v1/completions", dependencies=[Depends(validate_json_request)])
async def create_completion(request: CompletionRequest, raw_request: Request) -> Any:
    prepared = await _prepare(request, raw_request)
    if isinstance(prepared, Response):
        return prepared
    return await _finish(await completion_api.create_completion(request, raw_request), prepared)


class PredictionEndpoint:
    """The ``vllm.endpoint_plugins`` object (``EndpointPlugin`` protocol)."""

    name = NAME
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(router)

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        if engine_client is None:
            raise RuntimeError(f"{NAME} needs an engine (not the render-only server)")
        cfg = engine_client.vllm_config
        spec = cfg.speculative_config
        if spec is None or spec.method != "custom_class" or spec.model != CLASS_PATH:
            raise RuntimeError(
                f'{NAME} needs --speculative-config \'{{"method": "custom_class", '
                f'"model": "{CLASS_PATH}", "num_speculative_tokens": N}}\''
            )
        if cfg.observability_config.per_request_spec_decode_metrics == "none":
            raise RuntimeError(
                f"{NAME} reports OpenAI's prediction counts from vLLM's per-request "
                "counters: add --per-request-spec-decode-metrics summary"
            )
        state.specdec_prediction = Checker(
            engine_client.renderer.get_tokenizer(), int(cfg.model_config.max_model_len)
        )
        logger.info(MARKER)


def plugin() -> PredictionEndpoint:
    """The entry point's factory."""
    return PredictionEndpoint()
