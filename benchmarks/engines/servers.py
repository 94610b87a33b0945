"""Start and stop the OpenAI-compatible servers that the engine benchmarks point specdec at:
vLLM's CPU build, llama.cpp's llama-server, llama-cpp-python's server and ``specdec serve``,
each with speculation on or off, on loopback.

Nothing here is downloaded: the llama-server binary comes from ``build_llama_server.sh``,
vLLM's environment and its bf16 model directories from ``setup_vllm.sh`` (both under one
engines root, default /tmp/specdec-engines), the GGUF files from specdec's model store.
Each server's output goes to a log file; ``Server.stop`` ends the process group it started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SMALL = "smollm2-135m-instruct-q4_1"
DEFAULT_ROOT = Path(os.environ.get("SPECDEC_ENGINES", "/tmp/specdec-engines"))
REPO = Path(__file__).resolve().parents[2]
K = 4  # draft tokens per round, everywhere
# llama.cpp's n-gram speculation types (common/arg.cpp, --spec-type), run at their defaults
LLAMA_NGRAM_TYPES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v")


def model_path(name: str) -> str:
    from specdec import hub

    return str(hub.resolve(name, fetch=False))


@dataclass
class ServerSpec:
    """One server: its command line, environment and CPUs."""

    name: str  # e.g. "vllm-draft"
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    cpus: str | None = None  # taskset list, e.g. "0" or "0-1"
    start_timeout_s: float = 600.0
    # a line the server must print while starting, and one it must not (checked on this
    # start's part of the log once it answers): e.g. that a plugin was or was not loaded
    log_has: str | None = None
    log_lacks: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return (["taskset", "-c", self.cpus] if self.cpus else []) + self.argv


@dataclass
class Server:
    spec: ServerSpec
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def start(spec: ServerSpec, log_dir: Path) -> Server:
    """Start the server in its own process group and wait until /v1/models answers."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{spec.name}.log"
    offset = log.stat().st_size if log.exists() else 0
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(spec.command())}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            spec.command(),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.env},
            start_new_session=True,
        )
    server = Server(spec, proc, log)
    deadline = time.monotonic() + spec.start_timeout_s
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{spec.name} exited with {proc.returncode}:\n{tail}")
        try:
            r = httpx.get(spec.url + "/v1/models", timeout=5, trust_env=False)
            if r.status_code == 200:
                _check_log(server, offset)
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{spec.name} did not answer within {spec.start_timeout_s:.0f} s")
        time.sleep(2)


def _check_log(server: Server, offset: int) -> None:
    with server.log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    spec = server.spec
    problem = None
    if spec.log_has is not None and spec.log_has not in text:
        problem = f"did not print {spec.log_has!r}"
    elif spec.log_lacks is not None and spec.log_lacks in text:
        problem = f"printed {spec.log_lacks!r}"
    if problem:
        server.stop()
        raise RuntimeError(f"{spec.name} {problem} while starting (log: {server.log})")


@contextmanager
def running(specs: Sequence[ServerSpec], log_dir: Path) -> Iterator[list[Server]]:
    """Start the servers one after the other (so their start-ups do not compete), stop all."""
    started: list[Server] = []
    try:
        for s in specs:
            print(f"starting {s.name} on {s.url}", file=sys.stderr, flush=True)
            started.append(start(s, log_dir))
        yield started
    finally:
        for srv in reversed(started):
            srv.stop()


# -- the engines -------------------------------------------------------------------------------


# the vLLM general plugin in benchmarks/engines/vllm/plugin/ (setup_vllm.sh installs it): the
# fix for vLLM CPU 0.32.0's expand_kernel fallback, which never writes its output
VLLM_FIX_PLUGIN = "specdec_cpu_expand_fix"
VLLM_FIX_MARKER = "specdec_cpu_expand_fix: replaced vllm.utils.cpu_triton_utils._expand_kernel_impl"


# specdec-vllm (integrations/vllm, installed into vLLM's environment): its proposer class and
# its endpoint plugin; drafts of up to PREDICTION_K tokens (its drafter sizes each one)
VLLM_PREDICTION_PROPOSER = "specdec_vllm.PredictionProposer"
VLLM_PREDICTION_PLUGIN = "specdec_prediction"
PREDICTION_K = 16


def vllm_general_plugins(root: Path = DEFAULT_ROOT) -> list[str]:
    """The ``vllm.general_plugins`` entry points installed in vLLM's environment."""
    code = (
        "from importlib.metadata import entry_points\n"
        "print(','.join(e.name for e in entry_points(group='vllm.general_plugins')))"
    )
    out = subprocess.run(
        [str(root / "vllm-venv/bin/python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    return [n for n in out.split(",") if n]


def vllm(
    mode: str,
    port: int,
    *,
    root: Path = DEFAULT_ROOT,
    cpus: str = "0-1",
    kv_gib: int = 1,
    fix: bool = False,
    small: bool = False,
) -> ServerSpec:
    """vLLM CPU on the bf16 target: mode "off", "draft" (the 0.5B draft, K tokens), "ngram"
    (prompt lookup, K tokens) or "prediction" (specdec-vllm, ``integrations/vllm``: OpenAI's
    ``prediction`` drafted by specdec's prediction drafter, up to PREDICTION_K tokens, vLLM's
    n-gram lookup for requests without one) or "prediction-norejection" (the same with vLLM's
    rejection turned off, every draft token kept: a fault that a certificate must catch).
    Per-request speculative counters in every response.

    ``small``: the 0.5B model as the target, and with "draft" as its own draft (a spec-on and a
    spec-off server of the 1.5B target take about 17.5 GB here; of the 0.5B, a fraction).

    ``fix``: load the plugin that fixes the CPU expand_kernel fallback; otherwise vLLM runs as
    shipped. Either way ``VLLM_PLUGINS`` lists the other installed general plugins, so the two
    servers differ by that plugin alone, and the start is refused unless the log shows that
    the plugin did (or did not) replace the fallback."""
    argv = [
        str(root / "vllm-venv/bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(root / ("models/draft-bf16" if small else "models/target-bf16")),
        "--served-model-name",
        "qwen2.5-coder-0.5b" if small else "qwen2.5-coder-1.5b",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "8",
        "--seed",
        "0",
    ]
    cfg: dict[str, Any] = {}
    if mode == "draft":
        cfg = {"method": "draft_model", "model": str(root / "models/draft-bf16")}
    elif mode == "ngram":
        cfg = {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    elif mode in ("prediction", "prediction-norejection"):
        cfg = {"method": "custom_class", "model": VLLM_PREDICTION_PROPOSER}
    elif mode != "off":
        raise ValueError(
            f"vllm mode must be off, draft, ngram or prediction[-norejection], got {mode!r}"
        )
    if mode != "off":
        cfg["num_speculative_tokens"] = PREDICTION_K if mode.startswith("prediction") else K
        argv += ["--speculative-config", json.dumps(cfg)]
        argv += ["--enable-per-request-metrics", "--per-request-spec-decode-metrics", "summary"]
    plugins = vllm_general_plugins(root)
    if fix and VLLM_FIX_PLUGIN not in plugins:
        raise RuntimeError(f"{VLLM_FIX_PLUGIN} is not installed in {root}: run setup_vllm.sh")
    chosen = [p for p in plugins if p != VLLM_FIX_PLUGIN] + ([VLLM_FIX_PLUGIN] if fix else [])
    if mode.startswith(
        "prediction"
    ):  # the endpoint plugin (an entry point of vllm.endpoint_plugins)
        chosen.append(VLLM_PREDICTION_PLUGIN)
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": cpus,
        "VLLM_PLUGINS": ",".join(chosen),
    }
    if mode == "prediction-norejection":  # the fault fixture: every draft token kept
        env["SPECDEC_VLLM_FAULT"] = "keep-drafts"  # (integrations/vllm: fault.py)
    return ServerSpec(
        f"vllm-{mode}" + ("-small" if small else "") + ("-fixed" if fix else ""),
        argv,
        port,
        env=env,
        cpus=cpus,
        log_has=VLLM_FIX_MARKER if fix else None,
        log_lacks=None if fix else VLLM_FIX_MARKER,
    )


def llama_server(
    mode: str,
    port: int,
    *,
    root: Path = DEFAULT_ROOT,
    cpus: str = "0-1",
    slots: int = 1,
    model: str = TARGET,
    draft: str = DRAFT,
    ctx_per_slot: int = 2048,
) -> ServerSpec:
    """llama.cpp's llama-server on the Q4_K_M target: mode "off", "draft" (``-md`` the 0.5B
    draft, K tokens), "ngram" (``--spec-type ngram-simple``: 3-token lookup, K tokens), or
    one of llama.cpp's n-gram types by name ("ngram-simple", "ngram-mod", "ngram-map-k",
    "ngram-map-k4v") with llama.cpp's own defaults for it, as a user who names it gets."""
    threads = str(len(_cpu_list(cpus)))
    argv = [
        str(root / "llama.cpp-build/bin/llama-server"),
        "-m",
        model_path(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        threads,
        "-tb",
        threads,
        "-c",
        str(ctx_per_slot * slots),
        "-np",
        str(slots),
        "--alias",
        "qwen2.5-coder-1.5b" if model == TARGET else model,
        "--no-webui",
        "--metrics",
        "-lv",
        "1",
    ]
    if mode == "draft":
        argv += ["-md", model_path(draft), "--spec-type", "draft-simple"]
        argv += ["--spec-draft-n-max", str(K), "--spec-draft-n-min", "0"]
        argv += ["-td", threads, "-tbd", threads]
    elif mode == "ngram":
        argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"]
        argv += ["--spec-ngram-simple-size-m", str(K)]
    elif mode in LLAMA_NGRAM_TYPES:
        argv += ["--spec-type", mode]
    elif mode != "off":
        raise ValueError(
            f"llama-server mode must be off, draft, ngram or one of {LLAMA_NGRAM_TYPES}, "
            f"got {mode!r}"
        )
    return ServerSpec(f"llama-server-{mode}", argv, port, cpus=cpus, start_timeout_s=180)


def llama_cpp_python(
    mode: str,
    port: int,
    *,
    cpus: str = "0-1",
    model: str = TARGET,
    lookup: int = K,
    batch_threads: bool = True,
    threads: int | None = None,
) -> ServerSpec:
    """llama-cpp-python's server: mode "off" or "lookup" (its prompt-lookup drafter, the only
    one its server offers). Both thread counts set: ``n_threads_batch`` defaults to all cores,
    which makes every verification pass compete with the other server (``batch_threads=False``
    leaves it at that default, as the issue's run did). ``threads``: ``--n_threads`` (default:
    one per CPU in ``cpus``)."""
    n = str(threads or len(_cpu_list(cpus)))
    argv = [
        sys.executable,
        "-m",
        "specdec.llama_trust.llama_server_guard",  # llama_cpp.server behind the kernel check
        "--model",
        model_path(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "2048",
        "--n_threads",
        n,
        *(["--n_threads_batch", n] if batch_threads else []),
        "--model_alias",
        "qwen2.5-coder-1.5b" if model == TARGET else model,
        "--interrupt_requests",
        "false",
        "--verbose",
        "false",
    ]
    if mode == "lookup":
        argv += ["--draft_model", "prompt-lookup-decoding"]
        argv += ["--draft_model_num_pred_tokens", str(lookup)]
    elif mode != "off":
        raise ValueError(f"llama-cpp-python mode must be off or lookup, got {mode!r}")
    return ServerSpec(f"llama-cpp-python-{mode}", argv, port, cpus=cpus, start_timeout_s=180)


def specdec_serve(
    port: int,
    *,
    cpus: str = "0-1",
    extra: Sequence[str] = (),
    name: str = "specdec-serve",
    draft: str = DRAFT,
) -> ServerSpec:
    """``specdec serve`` with the project's default pair (0.5B llama.cpp draft, 1.5B target
    as its default backend chooses); spec-off requests use its per-request switch. ``extra``:
    more flags (``--exact``); ``draft``: another drafter (``ngram``)."""
    threads = str(len(_cpu_list(cpus)))
    argv = [
        str(Path(sys.executable).parent / "specdec"),
        "serve",
        "-m",
        TARGET,
        "-md",
        draft,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        threads,
        "-k",
        str(K),
        "--served-model-name",
        "qwen2.5-coder-1.5b",
        *extra,
    ]
    return ServerSpec(name, argv, port, cpus=cpus, start_timeout_s=600)


def _cpu_list(cpus: str) -> list[int]:
    out: list[int] = []
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out
