"""The vLLM proposer: ``--speculative-config '{"method": "custom_class", "model":
"specdec_vllm.PredictionProposer", "num_speculative_tokens": 16}'``.

vLLM (0.32) builds a ``custom_class`` proposer with the engine's config alone and calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` after
every step (``vllm/v1/worker/gpu_model_runner.py``, ``propose_draft_token_ids``): the rows of
the persistent batch, without their request ids or sampling parameters, which is where a
request's prediction travels (``SamplingParams.extra_args``, set from ``vllm_xargs`` by the
endpoint plugin). The model runner that creates the proposer holds both, so the proposer
keeps a reference to it (found on the call stack at construction) and reads, at each step,
``runner.input_batch.req_ids[i]`` and ``runner.requests[req_id]`` (prompt length, sampling
parameters) for row i. It reads and never writes them; nothing of vLLM is patched.

Rows are drafted by ``drafting.PredictionDrafts`` (specdec's ``PredictionDrafter`` per
request); rows without a prediction by vLLM's own ``NgramProposer`` (``settings.py``).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from vllm.logger import init_logger

from specdec_vllm.drafting import PredictionDrafts, Row
from specdec_vllm.fault import install_fault
from specdec_vllm.settings import Settings
from specdec_vllm.step_costs import StepClock
from specdec_vllm.wire import XARG, token_ids

logger = init_logger("vllm.specdec_vllm")
CLASS_PATH = "specdec_vllm.PredictionProposer"
# printed once per process that built the proposer (the benchmarks look for it in the log)
MARKER = "specdec_vllm: prediction proposer"


def find_runner() -> Any:
    """The vLLM model runner whose constructor is building this proposer (the caller of
    ``create_custom_proposer``)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, GPUModelRunner):
            return owner
        frame = frame.f_back  # type: ignore[assignment]
    raise RuntimeError(
        f"{CLASS_PATH} must be built by vLLM's model runner (speculative_config method "
        "custom_class); no GPUModelRunner is on the stack"
    )


class PredictionProposer:
    """Drafts each request's prediction (OpenAI's ``prediction``, carried in
    ``extra_args["specdec_prediction"]`` as token ids) with specdec's prediction drafter,
    and requests without one with vLLM's n-gram lookup."""

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.window = int(vllm_config.model_config.max_model_len)
        self.vocab = int(vllm_config.model_config.get_vocab_size())
        self.settings = Settings.from_env(self.k)
        if install_fault(self.settings.fault):
            logger.warning("%s: FAULT %s (every draft token kept)", MARKER, self.settings.fault)
        self.runner = find_runner()
        self.ngram = _ngram_proposer(vllm_config, self.settings) if self.settings.ngram else None
        self.drafts = PredictionDrafts(self.k, StepClock(fixed=self.settings.step_costs))
        self._last: float | None = None
        self._record: TextIO | None = (
            open(self.settings.record, "a", encoding="utf-8") if self.settings.record else None  # noqa: SIM115
        )
        self._recorded: dict[str, int] = {}
        ng = self.settings.ngram
        if self._record is not None:  # one header line per server run, then one per step
            import vllm

            header = {
                "k": self.k,
                "vllm": vllm.__version__,
                "ngram": ng and vars(ng),
                "step_costs": self.settings.step_costs,
            }
            self._record.write(json.dumps(header) + "\n")
        logger.info(
            "%s: K=%d, requests without a prediction: %s",
            MARKER,
            self.k,
            f"n-gram lookup {ng.min_n}-{ng.max_n}, K={ng.k}" if ng else "no drafts",
        )

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model: vLLM's CPU runner calls this on every proposer."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        now = time.perf_counter()
        elapsed = None if self._last is None else now - self._last
        self._last = now
        batch = self.runner.input_batch
        if batch.token_ids_cpu is not token_ids_cpu:
            raise RuntimeError(f"{CLASS_PATH}: the rows are not the model runner's batch")
        rows = [
            self._row(i, req_id, len(sampled), int(num_tokens_no_spec[i]), token_ids_cpu)
            for i, (req_id, sampled) in enumerate(
                zip(batch.req_ids, sampled_token_ids, strict=False)
            )
        ]

        def fallback(indices: list[int]) -> list[list[int]]:
            assert self.ngram is not None and self.settings.ngram is not None
            masked: list[list[int]] = [[] for _ in sampled_token_ids]
            for i in indices:
                masked[i] = sampled_token_ids[i]
            out = self.ngram.propose(
                self.settings.ngram.k, masked, num_tokens_no_spec, token_ids_cpu
            )
            return [list(out[i]) for i in indices]

        drafts = self.drafts.step(rows, elapsed, fallback if self.ngram is not None else None)
        if self._record is not None:
            self._write(rows, elapsed, drafts)
        return drafts

    def _row(self, i: int, req_id: str, sampled: int, n: int, token_ids_cpu: Any) -> Row:
        state = self.runner.requests.get(req_id)
        if state is None:  # not a request the runner knows: nothing to draft on
            return Row(req_id, (), n, 0, 0)
        prompt_len = int(state.num_prompt_tokens)
        params = state.sampling_params
        room = self.window - n
        max_tokens = getattr(params, "max_tokens", None)
        if max_tokens is not None:
            room = min(room, int(max_tokens) - (n - prompt_len))
        xargs = getattr(params, "extra_args", None) or {}
        prediction = token_ids(xargs.get(XARG), self.vocab, self.window)
        context: Sequence[int] = token_ids_cpu[i, :n].tolist() if prediction is not None else ()
        return Row(req_id, context, prompt_len, sampled, room - 1, prediction)

    def _write(self, rows: list[Row], elapsed: float | None, drafts: list[list[int]]) -> None:
        """One JSON line per step: per row its new tokens since the last line (the whole
        context, its prompt length and prediction the first time), and its draft."""
        assert self._record is not None
        out = []
        for r, d in zip(rows, drafts, strict=True):
            item: dict[str, Any] = {"id": r.req_id, "sampled": r.sampled, "room": r.room}
            if r.prediction is not None:
                seen = self._recorded.get(r.req_id)
                if seen is None:
                    item["prompt_len"] = r.prompt_len
                    item["prediction"] = list(r.prediction)
                    seen = 0
                item["new"] = list(r.context[seen:])
                self._recorded[r.req_id] = len(r.context)
            item["draft"] = d
            out.append(item)
        self._record.write(json.dumps({"elapsed_s": elapsed, "rows": out}) + "\n")
        self._record.flush()


def _ngram_proposer(vllm_config: Any, settings: Settings) -> Any:
    """vLLM's own NgramProposer with the fallback's settings (custom_class zeroes the n-gram
    fields of the engine's speculative config, so it gets a copy with them set)."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    ng = settings.ngram
    assert ng is not None
    spec = copy.copy(vllm_config.speculative_config)
    spec.prompt_lookup_min = ng.min_n
    spec.prompt_lookup_max = ng.max_n
    spec.num_speculative_tokens = ng.k
    cfg = copy.copy(vllm_config)
    cfg.speculative_config = spec
    return NgramProposer(cfg)
