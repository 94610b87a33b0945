"""specdec-vllm inside vLLM: servers of vLLM's OpenAI API on a tiny random model built here,
one without speculation, one with the plugin, and one with the plugin and vLLM's rejection
turned off (``SPECDEC_VLLM_FAULT=keep-drafts``, every draft kept: the fault the checks must
catch; vLLM's own ``rejection_sample_method: synthetic`` is refused by vLLM CPU's kernel).

Needs a vLLM environment (default ``/tmp/specdec-engines/vllm-venv``, made by
``benchmarks/engines/setup_vllm.sh``; another with ``SPECDEC_VLLM_PYTHON``) into which
``integrations/vllm`` is installed (its entry point); this checkout's code is put first on
that interpreter's path. Skipped with the reason otherwise. Marked ``vllm`` and ``slow``
(three servers start: a few minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tiny_models import make_tiny_hf

httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integrations/vllm/src"))

from specdec_vllm.wire import ACCEPTED, REJECTED  # noqa: E402

from test_vllm_adapter import _replay  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = Path(
    os.environ.get("SPECDEC_VLLM_PYTHON", "/tmp/specdec-engines/vllm-venv/bin/python")
)
PROPOSER = "specdec_vllm.PredictionProposer"
K = 8
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
# drafts sized on a fixed line (a step of T tokens: 1 + 0.02 (T - 1)), not learned: on this
# tiny model a step's cost is mostly vLLM's per-token work, and drafting would not pay (so
# the plugin, rightly, would stop drafting and the checks below would have nothing to check)
STEP_COSTS = "1,0.02"
PROMPTS = ["def fib(n):\n    ", "The quick brown fox", "for i in range(10):\n"]


def _vllm_or_skip() -> list[str]:
    """The general plugins to load with ours (the CPU expand-kernel fix where installed)."""
    if not VLLM_PYTHON.exists():
        pytest.skip(
            f"no vLLM environment at {VLLM_PYTHON} (benchmarks/engines/setup_vllm.sh makes "
            "one; SPECDEC_VLLM_PYTHON names another)"
        )
    code = (
        "import vllm, specdec_vllm\n"
        "from importlib.metadata import entry_points as e\n"
        "print(vllm.__version__)\n"
        "print(','.join(p.name for p in e(group='vllm.endpoint_plugins')))\n"
        "print(','.join(p.name for p in e(group='vllm.general_plugins')))\n"
    )
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    r = subprocess.run(
        [str(VLLM_PYTHON), "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    if r.returncode != 0:
        pytest.skip(f"vLLM does not import in {VLLM_PYTHON}: {r.stderr.strip()[-300:]}")
    lines = r.stdout.strip().splitlines()
    if "specdec_prediction" not in lines[1].split(","):
        pytest.skip(f"integrations/vllm is not installed in {VLLM_PYTHON} (pip install it there)")
    return [p for p in lines[2].split(",") if p == "specdec_cpu_expand_fix"]


def _pythonpath() -> str:
    return os.pathsep.join([str(ROOT / "src"), str(ROOT / "integrations/vllm/src")])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(
    model: Path,
    logs: Path,
    name: str,
    plugins: list[str],
    spec: dict[str, Any] | None,
    env: dict[str, str] | None = None,
) -> Server:
    port = _port()
    argv = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "4",
        "--seed",
        "0",
    ]
    chosen = list(plugins)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
        argv += ["--per-request-spec-decode-metrics", "summary"]
        chosen.append("specdec_prediction")
    cpus = sorted(os.sched_getaffinity(0))
    run_env = {
        **os.environ,
        "PYTHONPATH": _pythonpath(),
        "VLLM_PLUGINS": ",".join(chosen) or "none",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}-{cpus[-1]}",
        "HF_HUB_OFFLINE": "1",
        **(env or {}),
    }
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=run_env, start_new_session=True
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(server.url + "/v1/models", timeout=5, trust_env=False).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(2)
    server.stop()
    raise RuntimeError(f"{name} did not start in 600 s (log: {log})")


@dataclass
class Servers:
    plain: Server
    plugin: Server
    fault: Server
    record: Path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    plugins = _vllm_or_skip()
    base = tmp_path_factory.mktemp("vllm")
    model = make_tiny_hf(
        base / "model",
        seed=3,
        arch="qwen2",
        hidden=128,
        positions=512,
        chat_template=CHAT_TEMPLATE,
    )
    record = base / "steps.jsonl"
    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K}
    started: list[Server] = []
    try:
        started.append(_start(model, base, "plain", plugins, None))
        env = {"SPECDEC_VLLM_STEP_COSTS": STEP_COSTS}
        started.append(
            _start(
                model, base, "plugin", plugins, spec, {**env, "SPECDEC_VLLM_RECORD": str(record)}
            )
        )
        fault = {**env, "SPECDEC_VLLM_FAULT": "keep-drafts"}
        started.append(_start(model, base, "fault", plugins, spec, fault))
        yield Servers(*started, record=record)
    finally:
        for s in started:
            s.stop()


def _post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps escapes non-ASCII (a lone surrogate becomes the JSON escape \ud800, which
    # httpx's own encoder cannot write as UTF-8)
    return httpx.post(
        server.url + path,
        content=json.dumps({"model": "tiny", **body}),
        headers={"Content-Type": "application/json"},
        timeout=300,
        trust_env=False,
    )


def _complete(server: Server, prompt: str, n: int = 48, **extra: Any) -> dict[str, Any]:
    r = _post(
        server, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, **extra}
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def _prediction(text: str) -> dict[str, Any]:
    return {"prediction": {"type": "content", "content": text}}


def test_greedy_output_with_the_plugin_is_vllms_without_speculation(servers: Servers) -> None:
    for prompt in PROMPTS:
        plain = _complete(servers.plain, prompt)["choices"][0]["text"]
        edited = plain[:10] + "XYZ" + plain[14:]
        for prediction in (plain, edited, plain[::-1], "", None):
            extra = {} if prediction is None else _prediction(prediction)
            got = _complete(servers.plugin, prompt, **extra)
            assert got["choices"][0]["text"] == plain, (prompt, prediction)
            details = got["usage"]["completion_tokens_details"]
            spec = got["metrics"]["speculative_decoding"]
            if prediction is None:
                assert details == {ACCEPTED: 0, REJECTED: 0}
            else:  # every draft of a request with a prediction is the prediction's
                assert details[ACCEPTED] == spec["num_accepted_draft_tokens"]
                assert details[ACCEPTED] + details[REJECTED] == spec["num_draft_tokens"]
        exact = _complete(servers.plugin, prompt, **_prediction(plain))
        # the exact output as prediction: most of it is drafted and kept
        assert exact["usage"]["completion_tokens_details"][ACCEPTED] >= 48 // 2


def test_chat_and_streaming_carry_the_counts(servers: Servers) -> None:
    messages = [{"role": "user", "content": "hello"}]
    body = {"messages": messages, "max_tokens": 32, "temperature": 0}
    plain = _post(servers.plain, "/v1/chat/completions", body).json()
    text = plain["choices"][0]["message"]["content"]
    r = _post(servers.plugin, "/v1/chat/completions", {**body, **_prediction(text)})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == text
    assert r.json()["usage"]["completion_tokens_details"][ACCEPTED] > 0
    stream = {
        **body,
        **_prediction(text),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST",
        servers.plugin.url + "/v1/chat/completions",
        json={"model": "tiny", **stream},
        timeout=300,
        trust_env=False,
    ) as s:
        chunks = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: {")]
    pieces = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert pieces == text
    usage = [c["usage"] for c in chunks if not c["choices"] and c.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens_details"][ACCEPTED] > 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_prediction("x" * 600), "prediction"),  # 600 characters: 600 tokens > 512
        ({"prediction": {"type": "text", "content": "x"}}, "prediction.type"),
        ({"prediction": "x"}, "prediction"),
        ({"prediction": {"type": "content", "content": "\ud800"}}, "prediction.content"),
        ({**_prediction("x"), "n": 2}, "n"),
        ({"vllm_xargs": {"specdec_prediction": [1, 2]}}, "vllm_xargs.specdec_prediction"),
    ],
)
def test_bad_predictions_get_vllms_400_and_the_server_stays_up(
    servers: Servers, body: dict[str, Any], param: str
) -> None:
    r = _post(servers.plugin, "/v1/completions", {"prompt": "x", "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert _complete(servers.plugin, "x", n=4)["choices"][0]["text"] is not None


def test_invalid_utf8_in_the_body_is_a_400_and_the_server_stays_up(servers: Servers) -> None:
    raw = (
        b'{"model": "tiny", "prompt": "x", "max_tokens": 4, '
        b'"prediction": {"type": "content", "content": "\xff\xfe"}}'
    )
    r = httpx.post(
        servers.plugin.url + "/v1/completions",
        content=raw,
        headers={"Content-Type": "application/json"},
        timeout=60,
        trust_env=False,
    )
    assert r.status_code == 400
    assert _complete(servers.plugin, "x", n=4)["choices"][0]["text"] is not None


def test_the_fault_with_rejection_off_changes_greedy_output(servers: Servers) -> None:
    """The check above can fail: with every draft kept, a wrong prediction is the output."""
    differs = 0
    for prompt in PROMPTS:
        plain = _complete(servers.plain, prompt)["choices"][0]["text"]
        got = _complete(servers.fault, prompt, **_prediction(plain[::-1]))["choices"][0]["text"]
        differs += got != plain
    assert differs == len(PROMPTS)


def test_the_recorded_steps_replay_to_the_same_drafts_without_vllm(servers: Servers) -> None:
    _complete(servers.plugin, PROMPTS[0], **_prediction("def fib(n): return n"))
    lines = [json.loads(x) for x in servers.record.read_text().splitlines() if x.strip()]
    assert "k" in lines[0] and lines[0]["k"] == K
    steps, drafted, rows = _replay(lines[1:], k=K, step_costs=lines[0]["step_costs"])
    assert steps > 10 and rows > 0 and drafted > 0
