"""Trusting llama.cpp's build and kernels: what specdec checks before a llama.cpp model runs.

``build_flags`` is the build plan (how `make install` builds llama-cpp-python for this CPU,
with ``patches/``'s row-invariant patch, and the key that names the build); ``lib_identity``
names the library a process really mapped (its SHA-256 and patch version); ``ggml_bufts``
reads ggml's buffer types and the build's row-invariant switch; ``kernel_check`` (with
``kernel_probe``, its child process) checks at first load, in child processes, that the
optional kernels neither crash nor compute other numbers, and caches the verdict;
``exact_kernels`` (with ``models.exact_probe``, the backend under test) finds which optional
kernels keep every row of a pass bit-identical, for exact numerics; ``llama_params`` sets
what ``Llama()`` does not expose; ``llama_server_guard`` applies the same checks to a
llama-server a user starts. The backends (``models/``) and the doctor import this package;
the tools above them reach what they record through ``models.llamacpp``
(tests/test_architecture.py keeps it so).
"""
