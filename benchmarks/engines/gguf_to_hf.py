"""Dequantize a GGUF file into a bf16 Hugging Face directory (config.json, safetensors,
tokenizer files) for engines that read that format (vLLM). Runs in specdec's environment
(transformers + gguf); the output goes to an ignored cache directory.

transformers records the GGUF origin as ``quantization_config`` (type gguf) in config.json,
which vLLM rejects ("Unknown quantization method: gguf"): the key is dropped, since the saved
weights are dense.

    .venv/bin/python benchmarks/engines/gguf_to_hf.py MODEL_NAME_OR_GGUF OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any


def convert(gguf: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.models.hf import check_dense, gguf_dequantize_kwargs

    if (out / "config.json").exists() and (out / "converted-from.json").exists():
        return out
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, **gguf_dequantize_kwargs()
    )
    check_dense(model, gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.hf_quantizer = None
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2))
    (tmp / "converted-from.json").write_text(json.dumps({"gguf": str(gguf), "dtype": "bf16"}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a specdec model name (specdec models path NAME) or a .gguf")
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    src = Path(a.model)
    if src.suffix != ".gguf":
        from specdec import hub

        src = Path(hub.resolve(a.model, fetch=False))
    if not src.is_file():
        print(f"error: {src} is not a file", file=sys.stderr)
        return 2
    print(convert(src, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
