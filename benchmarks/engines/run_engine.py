"""`specdec bench --endpoint` and `specdec certify --endpoint` against a real engine, with
speculation on and off: the servers are started here (``servers.py``), the specdec commands
run as a user would type them, and everything they print goes next to their results.

    .venv/bin/python benchmarks/engines/run_engine.py ENGINE MODE STEP [--root DIR] [--out DIR]

ENGINE / MODE: ``vllm`` draft|ngram, ``llama-server`` draft|ngram, ``llama-cpp-python``
lookup (the spec-off server is the same engine without speculation); ``off`` puts the spec-off
server on both sides (for ``certify``: an A/A run, which must PASS). STEP:

- ``switch``: one spec-on server alone, the per-request switch (``speculative.n_max = 0``);
  the probe must either verify it from the draft counters or refuse it.
- ``bench``: both servers on both cores, the bench's concurrency sweep (1, 2, 4: llama-server
  gets 4 slots), greedy, 64 tokens, the six Spec-Bench categories.
- ``certify``: each server on its own core (they work at once, one request each); the plan
  is given by ``--plan``: ``quick`` (specdec's), ``full`` (the sizes below) or ``budget:M``
  (4 greedy prompts, 2 sampled prompts with up to 150 requests per side, as many as fit in M
  minutes); resumable.
- ``wrong``: ``certify --quick`` through ``wrong_proxy.py`` in front of the spec-on server
  (``--fault``); it must FAIL.
- ``probe``: the spec-on server alone and idle, ``sampled_probe.py`` (one prompt, sampled
  and greedy, with the sampling fields a client might send).

Results: OUT/ENGINE/ (default benchmarks/results/engines), one log per step with the machine
load (``uptime``) before and after, the commands, and what they printed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import servers as S

HERE = Path(__file__).resolve().parent
SPECDEC = str(Path(sys.executable).parent / "specdec")
PORTS = {"vllm": 18200, "llama-server": 18210, "llama-cpp-python": 18220}
OFF_MODE = {"vllm": "off", "llama-server": "off", "llama-cpp-python": "off"}
CERTIFY_BUDGET = [
    "--greedy-prompts",
    "4",
    "--max-new-tokens",
    "32",
    "--sampled-prompts",
    "2",
    "--samples",
    "150",
    "--sample-tokens",
    "8",
]
# full certify plan (quick is specdec's own --quick)
CERTIFY_FULL = [
    "--greedy-prompts",
    "6",
    "--max-new-tokens",
    "48",
    "--sampled-prompts",
    "3",
    "--samples",
    "120",
    "--sample-tokens",
    "8",
]


def spec_for(
    engine: str,
    mode: str,
    port: int,
    root: Path,
    cpus: str,
    slots: int = 1,
    model: str = S.TARGET,
    batch_threads: bool = True,
    threads: int | None = None,
    fix: bool = False,
    small: bool = False,
) -> S.ServerSpec:
    if engine == "vllm":
        return S.vllm(mode, port, root=root, cpus=cpus, fix=fix, small=small)
    if engine == "llama-server":
        return S.llama_server(mode, port, root=root, cpus=cpus, slots=slots, model=model)
    if engine == "llama-cpp-python":
        return S.llama_cpp_python(
            mode, port, cpus=cpus, model=model, batch_threads=batch_threads, threads=threads
        )
    raise SystemExit(f"unknown engine {engine!r}")


class Log:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.f = path.open("a", encoding="utf-8")

    def line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.f.write(f"[{stamp}] {text}\n")
        self.f.flush()
        print(text, file=sys.stderr, flush=True)

    def load(self, when: str) -> None:
        up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        self.line(f"load {when}: {up}")

    def machine(self) -> None:
        """The CPU model, core count and flags (lscpu), and whether other work shares it."""
        info = dict(
            ln.split(":", 1)
            for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if ":" in ln
        )
        model, flags = info.get("Model name", "?").strip(), info.get("Flags", "?").strip()
        self.line(f"machine: {model}, {os.cpu_count()} CPUs; flags: {flags}")

    def servers(self, specs: Sequence[S.ServerSpec]) -> None:
        for spec in specs:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items())
            self.line(f"server {spec.name}: {env} {' '.join(map(shlex.quote, spec.command()))}")

    def run(self, argv: Sequence[str]) -> int:
        self.line("$ " + " ".join(shlex.quote(a) for a in argv))
        t = time.monotonic()
        p = subprocess.run(list(argv), capture_output=True, text=True, cwd=S.REPO)
        for stream in (p.stdout, p.stderr):
            for ln in stream.splitlines():
                if ": sampled:" in ln:  # progress lines: keep the log short
                    continue
                self.f.write("  " + ln + "\n")
        self.line(f"exit status {p.returncode} after {time.monotonic() - t:.0f} s")
        return p.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", choices=sorted(PORTS))
    ap.add_argument(
        "mode",
        choices=("draft", "ngram", "lookup", "off", "prediction", "prediction-norejection"),
        help="the spec-on side's speculation; off: the spec-off server on both sides (an A/A "
        "certificate: the test's own false-alarm check on this engine); vllm prediction: "
        "specdec-vllm (integrations/vllm), with -norejection: its fault fixture (vLLM's "
        "rejection off)",
    )
    ap.add_argument(
        "--prompts",
        help="certify's --prompts (e.g. code_predict: code edits whose 'prediction' is sent "
        "with every request); the result names get its stem",
    )
    ap.add_argument(
        "--api",
        choices=("completions", "chat"),
        help="certify's --endpoint-api (default: certify's, completions); chat: the prompt as "
        "the user turn (an instruction model then answers with the edited code, which a "
        "prediction drafts); the result names get -chat",
    )
    ap.add_argument("step", choices=("switch", "bench", "certify", "wrong", "probe"))
    ap.add_argument("--root", type=Path, default=S.DEFAULT_ROOT)
    ap.add_argument("--out", type=Path, default=S.REPO / "benchmarks/results/engines")
    ap.add_argument("--plan", default="full", help="quick, full or budget:MINUTES")
    ap.add_argument("--fault", default="swap:0.5", help="wrong_proxy.py's --fault")
    ap.add_argument(
        "--tie-gap",
        type=float,
        help="certify's --tie-gap (nats; chosen before the run, e.g. one bf16 step of the "
        "logits for a bf16 engine)",
    )
    ap.add_argument(
        "--model",
        default=S.TARGET,
        help=f"the GGUF target of the llama.cpp engines (default {S.TARGET}; {S.SMALL}: the "
        "small test model, prompt lookup only)",
    )
    ap.add_argument(
        "--default-batch-threads",
        action="store_true",
        help="llama-cpp-python: leave --n_threads_batch at its default (all cores)",
    )
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="certify: both servers on all cores (as a user starts them) instead of one each",
    )
    ap.add_argument(
        "--vllm-fix",
        action="store_true",
        help="vllm: the spec-on server loads the plugin that fixes vLLM CPU's expand_kernel "
        "fallback (benchmarks/engines/vllm/); the spec-off server runs vLLM as shipped, as "
        "without the flag",
    )
    ap.add_argument(
        "--vllm-small",
        action="store_true",
        help="vllm: the 0.5B model as the target on both sides (with draft: also its own "
        "draft), for a machine without the memory for two servers of the 1.5B target",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="llama-cpp-python: --n_threads per server (default: one per core it runs on); "
        "with --no-pin --default-batch-threads --threads 1 the servers start as in the issue",
    )
    a = ap.parse_args(argv)
    # a plain `kill` ends the run through the `finally` blocks that stop the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    out = a.out / a.engine
    name = f"{a.step}-{a.mode}"
    if a.model != S.TARGET:
        name += "-" + a.model.split("-")[0]
    if a.step == "wrong":
        name += "-" + a.fault.replace(":", "")
    if a.step == "certify" and a.plan != "full":
        name += "-" + a.plan.replace(":", "")
    if a.tie_gap is not None:
        name += f"-tie{a.tie_gap:g}"
    if a.prompts:
        name += "-" + Path(a.prompts).stem.replace("_", "-")
    if a.api == "chat":
        name += "-chat"
    if a.default_batch_threads:
        name += "-default-batch-threads"
    if a.no_pin and a.step != "bench":
        name += "-unpinned"
    if a.threads:
        name += f"-t{a.threads}"
    if (a.vllm_fix or a.vllm_small) and a.engine != "vllm":
        ap.error("--vllm-fix and --vllm-small are for the vllm engine")
    if a.vllm_small:
        name += "-small"
    if a.vllm_fix:
        name += "-fixed"
    log = Log(out / f"{name}.log")
    log.line(f"{a.engine} {a.mode} {a.step}: results in {out}")
    log.machine()
    log.load("before")
    port = PORTS[a.engine]
    logs = Path(os.environ.get("SPECDEC_ENGINE_LOGS", "/tmp/specdec-engine-logs"))
    rc = 0
    # the spec-off server never loads the fix: it is the reference, vLLM as shipped
    off_opts = {"small": a.vllm_small} if a.engine == "vllm" else {}
    on_opts = {**off_opts, "fix": a.vllm_fix} if a.engine == "vllm" else {}
    if a.step == "switch":
        on = spec_for(a.engine, a.mode, port, a.root, "0-1", model=a.model, **on_opts)
        log.servers([on])
        with S.running([on], logs):
            rc = log.run(
                [SPECDEC, "bench", "--endpoint", on.url, "--concurrency", "1",
                 "--categories", "mt_bench", "--max-new-tokens", "16", "--no-progress",
                 "--out", str(out / f"{name}.jsonl"), "--overwrite"]
            )  # fmt: skip
    elif a.step == "probe":
        on = spec_for(a.engine, a.mode, port, a.root, "0-1", model=a.model, **on_opts)
        log.servers([on])
        with S.running([on], logs):
            rc = log.run([sys.executable, str(HERE / "sampled_probe.py"), on.url])
    elif a.step == "bench":
        slots = 4 if a.engine == "llama-server" else 1
        on = spec_for(a.engine, a.mode, port, a.root, "0-1", slots, a.model, **on_opts)
        off = spec_for(
            a.engine, OFF_MODE[a.engine], port + 1, a.root, "0-1", slots, a.model, **off_opts
        )
        results = out / f"{name}.jsonl"
        log.servers([off, on])
        with S.running([off, on], logs):
            rc = log.run(
                [SPECDEC, "bench", "--endpoint", on.url, "--endpoint-off", off.url,
                 "--concurrency", "1,2,4", "--max-new-tokens", "64", "--timeout", "600",
                 "--no-progress", "--out", str(results)]
                + (["--resume"] if results.exists() else [])
            )  # fmt: skip
    else:
        bt = not a.default_batch_threads
        c_on, c_off = ("0-1", "0-1") if a.no_pin else ("0", "1")
        on, off = (
            spec_for(
                a.engine,
                mode,
                p,
                a.root,
                c,
                model=a.model,
                batch_threads=bt,
                threads=a.threads,
                fix=fix,
                small=a.vllm_small,
            )
            for mode, p, c, fix in (
                (a.mode, port, c_on, a.vllm_fix),
                (OFF_MODE[a.engine], port + 1, c_off, False),
            )
        )
        cert = out / name
        plan = ["--quick"]
        if a.step == "certify" and a.plan == "full":
            plan = CERTIFY_FULL
        elif a.step == "certify" and a.plan.startswith("budget:"):
            plan = [*CERTIFY_BUDGET, "--max-minutes", a.plan.split(":", 1)[1]]
        if a.tie_gap is not None:
            plan += ["--tie-gap", str(a.tie_gap)]
        if a.prompts:
            plan += ["--prompts", a.prompts]
        if a.api:
            plan += ["--endpoint-api", a.api]
        log.servers([off, on])
        with S.running([off, on], logs):
            target = on.url
            proxy = None
            if a.step == "wrong":
                proxy_port = port + 5
                proxy = subprocess.Popen(
                    [sys.executable, str(HERE / "wrong_proxy.py"), "--upstream", on.url,
                     "--port", str(proxy_port), "--fault", a.fault]
                )  # fmt: skip
                target = f"http://127.0.0.1:{proxy_port}"
                time.sleep(3)
            try:
                rc = log.run(
                    [SPECDEC, "certify", "--endpoint", target, "--endpoint-off", off.url,
                     *plan, "--timeout", "600", "--out", str(cert)]
                    + (["--resume"] if (cert / "progress.jsonl").exists() else [])
                )  # fmt: skip
            finally:
                if proxy is not None:
                    proxy.terminate()
                    proxy.wait(10)
    log.load("after")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
