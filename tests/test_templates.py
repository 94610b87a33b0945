"""Chat templates from model files render in a sandbox with limits (issue 12): hostile
templates end in one clear error within a bounded time, and ordinary templates give exactly
the text transformers gives."""

from __future__ import annotations

import pytest

from specdec.templates import TemplateError, TemplateLimits, render_chat
from specdec.util.workers import WorkerProcess

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": 'hi <b> "quoted" ünï'},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "again"},
]

HOSTILE = [
    ("string repetition", "{{ 'a' * 10**10 }}", "a repetition of 1 items"),
    ("list repetition", "{{ ([1, 2] * 10**9) | length }}", "a repetition of 2 items"),
    ("huge power", "{% set n = 10 ** 7 %}{{ 2 ** n }}", "raising to the power 10000000"),
    (
        "nested loops without output",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "ran for more than 0.5 s",
    ),
    ("output flood", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "output passed"),
    ("python internals", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "is unsafe"),
    ("refusal", "{{ raise_exception('system messages are not supported') }}", "refused"),
    ("syntax error", "{% for m in messages %}", "does not parse"),
]


@pytest.mark.parametrize(("name", "template", "words"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_templates_stop_with_one_clear_error(name: str, template: str, words: str) -> None:
    """Each ends in the error that names the bound it hit (the message says which limit
    fired, so a run that finished some other way cannot pass)."""
    with pytest.raises(TemplateError, match="the chat template") as info:
        render_chat(template, MESSAGES, limits=TemplateLimits(seconds=0.5))
    assert words in str(info.value)


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOOLS_STYLE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{{ m | tojson }}{% if loop.last %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}>>{% endif %}"
)


@pytest.mark.parametrize("template", [CHATML, TOOLS_STYLE], ids=["chatml", "tojson-continue"])
def test_same_text_as_transformers(template: str) -> None:
    """What a tokenizer's apply_chat_template gives is what the sandbox gives (the hf backend
    now renders through it, so its prompts must not change)."""
    from tests.tiny_models import _char_tokenizer

    tok = _char_tokenizer()
    tok.chat_template = template  # type: ignore[attr-defined]
    want = tok.apply_chat_template(  # type: ignore[attr-defined]
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    specials = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}  # type: ignore[attr-defined]
    assert render_chat(template, MESSAGES, {**specials, "add_generation_prompt": True}) == want


# -- the worker process (issue 30): every operation bounded, off a server's request path ----


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> object:
    """A pool of its own, so that a test's workers (killed, or fakes) touch no other test."""
    from specdec.templates import isolation

    pool = isolation._Pool()
    monkeypatch.setattr(isolation, "_POOL", pool)
    yield pool
    pool.close()


def test_a_worker_stuck_in_one_operation_is_killed(
    fresh_pool: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operation no check names (a long C call: neither the timer nor a trace can stop
    it) holds its worker only until the wait runs out; the worker is then killed. A fake
    worker that says it is ready and never answers stands for it."""
    from specdec.templates import isolation

    stuck = (
        "import struct, sys, time\n"
        "body = b'{\"ready\": true}'\n"
        "sys.stdout.buffer.write(struct.pack('<Q', len(body)) + body)\n"
        "sys.stdout.buffer.flush()\n"
        "time.sleep(600)\n"
    )
    monkeypatch.setattr(isolation, "GRACE_S", 0.2)
    started: list[WorkerProcess] = []

    def worker() -> WorkerProcess:
        w = WorkerProcess(isolation.CHILD, isolation.START_TIMEOUT_S, boot=stuck)
        started.append(w)
        return w

    monkeypatch.setattr(isolation, "_start_worker", worker)
    with pytest.raises(TemplateError, match="its process was stopped"):
        render_chat("{{ 1 }}", MESSAGES, limits=TemplateLimits(seconds=0.1))
    assert started and not started[0].alive


def test_a_template_past_its_memory_limit_stops_its_worker_only(fresh_pool: object) -> None:
    """RLIMIT_AS in the worker: an allocation past the limit is one error, the worker is
    replaced, and the next render works."""
    import os

    if os.name != "posix":
        pytest.skip("the worker's limits need a POSIX system")
    hungry = "{{ ((range(99999)|list) * 3)|map('string')|list|length }}"
    with pytest.raises(TemplateError, match="memory limit"):
        render_chat(hungry, MESSAGES, limits=TemplateLimits(memory_bytes=8 << 20))
    assert render_chat("{{ messages|length }}", MESSAGES) == "4"


def test_a_template_renders_in_a_worker_process(fresh_pool: object) -> None:
    import os

    if os.name != "posix":
        pytest.skip("workers need a POSIX system")
    render_chat("{{ strftime_now('%Y') }}", MESSAGES)
    from specdec.templates import isolation

    idle = isolation._POOL._idle  # type: ignore[attr-defined]
    assert idle and idle[0].proc.pid != os.getpid() and idle[0].proc.poll() is None


def test_a_slow_template_does_not_hold_up_other_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """In serve the template renders outside the tokenizer's lock: a request whose template
    is still rendering (held here by a fake) lets another request render, tokenize and
    finish. Before, the lock was held for the whole render, so one hostile template stalled
    every request."""
    import threading

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    import specdec.templates.render as render_module
    from serve_harness import chatml_pair, running_server

    gate, entered = threading.Event(), threading.Event()
    real = render_module.render_chat

    def render(template: str, messages: list[dict[str, str]], *a: object, **kw: object) -> str:
        if messages[-1]["content"] == "slow":
            entered.set()
            gate.wait(60)
        return real(template, messages, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(render_module, "render_chat", render)
    chat = "/v1/chat/completions"
    body = {"max_tokens": 2, "temperature": 0}
    with running_server(chatml_pair(), k=0) as base:
        slow_body = {**body, "messages": [{"role": "user", "content": "slow"}]}
        slow = threading.Thread(target=lambda: httpx.post(base + chat, json=slow_body, timeout=90))
        slow.start()
        try:
            assert entered.wait(30)
            fast = {**body, "messages": [{"role": "user", "content": "fast"}]}
            r = httpx.post(base + chat, json=fast, timeout=30)  # a hang guard, not a measure
            assert r.status_code == 200, r.text
        finally:
            gate.set()
            slow.join(60)


def test_a_hostile_template_in_serve_is_bounded_and_blocks_no_one(
    fresh_pool: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real hostile template in a real server: its render runs in a worker process until
    the time limit stops it (one 400 naming the limit), while another request renders in a
    second worker, tokenizes and is answered before the hostile one ends. The limit is set
    long (8 s) only so that the other request surely finishes inside it on a loaded machine;
    nothing here measures time."""
    import os
    import threading

    if os.name != "posix":
        pytest.skip("the worker processes need a POSIX system")
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    import specdec.templates.render as render_module
    from serve_harness import CHATML, chatml_pair, running_server

    hostile = (
        "{% if messages[-1]['content'] == 'slow' %}{% for i in range(100000) %}"
        "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + CHATML
    )
    entered = threading.Event()
    real = render_module.render_chat

    def render(template: str, messages: list[dict[str, str]], *a: object, **kw: object) -> str:
        if messages[-1]["content"] == "slow":
            entered.set()  # the real render starts now, in a worker, with a real loop
        limits = TemplateLimits(seconds=8.0)
        return real(template, messages, *a, limits=limits)  # type: ignore[arg-type]

    monkeypatch.setattr(render_module, "render_chat", render)
    chat = "/v1/chat/completions"
    body = {"max_tokens": 2, "temperature": 0}
    slow_reply: list[object] = []
    slow_done = threading.Event()

    def post_slow(base: str) -> None:
        slow_body = {**body, "messages": [{"role": "user", "content": "slow"}]}
        try:
            slow_reply.append(httpx.post(base + chat, json=slow_body, timeout=90))
        finally:
            slow_done.set()

    with running_server(chatml_pair(hostile), k=0) as base:
        slow = threading.Thread(target=post_slow, args=(base,))
        slow.start()
        try:
            assert entered.wait(30)
            fast = {**body, "messages": [{"role": "user", "content": "fast"}]}
            r = httpx.post(base + chat, json=fast, timeout=60)  # a hang guard, not a measure
            assert r.status_code == 200, r.text
            assert not slow_done.is_set()  # answered while the hostile render still ran
        finally:
            slow.join(90)
        assert slow_done.is_set() and len(slow_reply) == 1
        got = slow_reply[0]
        assert isinstance(got, httpx.Response) and got.status_code == 400, got
        assert "ran for more than 8 s" in got.json()["error"]["message"]
        again = {**body, "messages": [{"role": "user", "content": "again"}]}
        assert httpx.post(base + chat, json=again, timeout=60).status_code == 200
