"""Chat templates from model files render in a sandbox with limits (issue 12): hostile
templates end in one clear error within a bounded time, and ordinary templates give exactly
the text transformers gives."""

from __future__ import annotations

import time

import pytest

from specdec.templates import TemplateError, TemplateLimits, render_chat

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
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match="the chat template") as info:
        render_chat(template, MESSAGES, limits=TemplateLimits(seconds=0.5))
    assert words in str(info.value)
    assert time.monotonic() - t0 < 5.0  # bounded: the limit plus start-up, never a hang


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
