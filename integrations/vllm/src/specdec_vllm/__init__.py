"""specdec-vllm: OpenAI's ``prediction`` field for vLLM, drafted by specdec's prediction
drafter (``docs/vllm-prediction.md``).

- ``PredictionProposer`` (``proposer.py``): the speculative proposer, vLLM's ``custom_class``
  method: ``--speculative-config '{"method": "custom_class", "model":
  "specdec_vllm.PredictionProposer", "num_speculative_tokens": 16}'``
- ``endpoint.py``: the ``vllm.endpoint_plugins`` entry point ``specdec_prediction`` (the
  ``prediction`` field in, OpenAI's counts out)
- ``drafting.py``, ``step_costs.py``, ``wire.py``, ``settings.py``: the parts that need no
  vLLM (tested without it)

``PredictionProposer`` is imported on first use, so the parts without vLLM import here too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PredictionProposer"]


def __getattr__(name: str) -> Any:
    if name == "PredictionProposer":
        from specdec_vllm.proposer import PredictionProposer

        return PredictionProposer
    raise AttributeError(f"module 'specdec_vllm' has no attribute {name!r}")
