"""A vLLM general plugin that fixes the CPU build's fallback for the rejection sampler's
``expand_kernel`` (vLLM CPU 0.32.0, ``vllm/utils/cpu_triton_utils.py``).

The bug: ``_expand_kernel_impl`` hands the C++ op ``expand_kernel_impl`` int64 copies of its
tensors (``_ensure_int64(output)``, ...) and never writes the result back, so ``output`` keeps
whatever it held. ``expand_batch_to_tokens`` allocates that output with ``new_empty``, and
``apply_sampling_constraints`` divides the target's logits by it (the per-request temperature
expanded to one value per draft token) whenever a batch is not all greedy; the per-token
top-k / top-p are expanded the same way. The C++ op also reads only int64, so copying the
result back would still truncate a float temperature (0.7 becomes 0, then the greedy
replacement turns it into 1).

The fix: the same expansion in PyTorch, in ``output``'s own dtype, written into ``output``
(what the Triton kernel does). vLLM loads ``vllm.general_plugins`` entry points in every
process before the CPU platform registers its Triton fallbacks (``init_worker``:
``load_general_plugins()``, then ``register_triton_kernel_overrides()``, which reads
``cpu_triton_utils._expand_kernel_impl`` when it runs), so replacing the module attribute is
enough; where the fallback is already registered, it is registered again.

Install into vLLM's environment (``setup_vllm.sh`` does) and choose per server with vLLM's
own allowlist: ``VLLM_PLUGINS`` unset loads every plugin, this one included; a list without
``specdec_cpu_expand_fix`` leaves vLLM as shipped.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

NAME = "specdec_cpu_expand_fix"
KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
# one line in every process that applied the fix; servers.py looks for it in the server log
MARKER = "specdec_cpu_expand_fix: replaced vllm.utils.cpu_triton_utils._expand_kernel_impl"

logger = logging.getLogger("vllm." + NAME)


def expand_kernel_impl(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: int | None = None,  # the Triton kernel's name
) -> None:
    """output[cu[i-1]:cu[i]] = input[i] (replace_to where input[i] == replace_from), in place,
    in output's dtype: vLLM's Triton ``expand_kernel`` in PyTorch."""
    cu = cu_num_tokens.to(torch.int64)
    if cu.numel() == 0:
        return
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )
    n = int(cu[-1])
    output[:n] = torch.repeat_interleave(values, counts, output_size=n).to(output.dtype)


def apply() -> bool:
    """Replace the CPU fallback; True when vLLM's CPU fallbacks exist in this install."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:  # not a vLLM with CPU Triton fallbacks: nothing to fix
        return False
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    from vllm.triton_utils import dispatcher

    if KERNEL in dispatcher._registry:  # the platform registered the broken one already
        dispatcher.register_kernels({KERNEL: expand_kernel_impl})
    logger.warning(MARKER)
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    apply()
