"""The fault fixture the lossless checks must catch: ``SPECDEC_VLLM_FAULT=keep-drafts``
makes vLLM's greedy rejection step keep every draft token, as if the target agreed with each.

vLLM's own switch for this (``rejection_sample_method: synthetic`` with acceptance rates of
1.0) is refused by vLLM CPU's greedy kernel ("Synthetic acceptance not supported with CPU
sampling", ``vllm/utils/cpu_triton_utils.py``, 0.32) and the engine dies at the first drafted
step. So the fault is made here, in the worker process that builds the proposer: the module
attribute ``vllm.v1.sample.rejection_sampler._rejection_greedy_sample`` (looked up by
``rejection_sample`` at each call) is wrapped so that the target's argmax it receives equals
the draft wherever there is a draft token; vLLM's kernel then does the rest as usual (bonus
token included). Nothing is changed unless the variable asks for it.
"""

from __future__ import annotations

from typing import Any

FAULT_ENV = "SPECDEC_VLLM_FAULT"
KEEP_DRAFTS = "keep-drafts"
FAULTS = (KEEP_DRAFTS,)


def parse_fault(text: str | None) -> str | None:
    """The fault asked for (None: none); ValueError on an unknown name."""
    if not text:
        return None
    if text not in FAULTS:
        raise ValueError(f"{FAULT_ENV} must be one of {', '.join(FAULTS)}, got {text!r}")
    return text


def forge_argmax(draft_token_ids: Any, target_argmax: Any) -> Any:
    """The target's argmax with every draft position replaced by its draft token (padded
    positions, -1, keep the target's): ``[num_tokens]`` both."""
    forged = target_argmax.clone()
    drafted = draft_token_ids >= 0
    forged[drafted] = draft_token_ids[drafted].to(forged.dtype)
    return forged


class KeepDrafts:
    """vLLM's greedy rejection kernel behind a forged argmax; every other attribute (its
    warm-up registration) is the kernel's own."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __call__(
        self,
        output_token_ids: Any,
        cu_num_draft_tokens: Any,
        draft_token_ids: Any,
        target_argmax: Any,
        *rest: Any,
        **kwargs: Any,
    ) -> Any:
        forged = forge_argmax(draft_token_ids, target_argmax)
        return self.kernel(
            output_token_ids, cu_num_draft_tokens, draft_token_ids, forged, *rest, **kwargs
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)


def install_fault(fault: str | None, module: Any = None) -> bool:
    """Apply ``fault`` to vLLM's rejection sampler module (``module``: that module, for
    tests); True when something was changed."""
    if fault != KEEP_DRAFTS:
        return False
    if module is None:
        import importlib

        module = importlib.import_module("vllm.v1.sample.rejection_sampler")
    kernel = getattr(module, "_rejection_greedy_sample", None)
    if kernel is None:  # another vLLM: the fault cannot be made here, and must not pass silently
        raise RuntimeError(
            f"{FAULT_ENV}={fault}: this vLLM has no _rejection_greedy_sample to wrap "
            "(made for vLLM 0.32's rejection sampler)"
        )
    if not isinstance(kernel, KeepDrafts):
        module._rejection_greedy_sample = KeepDrafts(kernel)
    return True
