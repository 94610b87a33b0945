"""llama-cpp-python's OpenAI server (``python -m llama_cpp.server``) behind the kernel check:
the local engine the endpoint tools and their tests start, loaded with the optional kernels
that passed on this machine (``llama_trust.kernel_check``), as every specdec load is.

    python -m specdec.llama_trust.llama_server_guard --model MODEL.gguf [llama_cpp.server options]

The options go to llama_cpp.server unchanged; ``--model`` and ``--n_threads`` are also read
here, for the check. The server renders chat templates itself (its own Jinja2), so unlike
specdec's loads, templates are compiled: only start it on model files you trust.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n_threads", type=int, default=None)
    known, _ = ap.parse_known_args(argv)
    import llama_cpp

    from specdec.hub.gguf import check_gguf_header
    from specdec.llama_trust.ggml_bufts import Choice
    from specdec.llama_trust.kernel_check import CheckSettings, kernel_verdict
    from specdec.llama_trust.llama_params import buffer_fields, loading

    path = Path(known.model)
    threads = known.n_threads or max(1, os.cpu_count() or 1)
    verdict = kernel_verdict(path, check_gguf_header(path), CheckSettings(n_threads=threads))
    fields, keep_alive = buffer_fields(llama_cpp, path, Choice.parse(verdict.choice))
    with loading(llama_cpp, templates=True, **fields):
        sys.argv = ["llama_cpp.server", *argv]
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
    del keep_alive


if __name__ == "__main__":
    main()
