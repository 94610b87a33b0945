"""Chat by default for `generate` and the API: the template when the model has one, raw text
otherwise; a system prompt and multi-turn messages; clear errors for bad messages."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from specdec.api import Pair
from specdec.cli import main
from specdec.errors import ConfigError, EmptyPromptError
from specdec.models.mock import MockLM, MockSpec, MockTokenizer
from specdec.prompting import (
    build_messages,
    check_messages,
    encode_prompt,
    encode_request,
    has_chat_template,
    read_messages,
)
from tiny_models import make_tiny_hf


class ChatMockTokenizer(MockTokenizer):
    """A mock tokenizer with a chat template: each turn is "<role>content", then "<gen>"."""

    chat_template = "mock"

    def apply_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        text = "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[gen]"
        return self.encode(text, add_special_tokens=False)


def chat_mock() -> MockLM:
    lm = MockLM(MockSpec(vocab_size=300))
    lm._tokenizer = ChatMockTokenizer(300)
    return lm


def ids(lm: MockLM, text: str) -> list[int]:
    return lm.tokenizer.encode(text, add_special_tokens=False)


def test_chat_by_default_when_the_model_has_a_template() -> None:
    lm = chat_mock()
    assert has_chat_template(lm) and not has_chat_template(MockLM())
    assert encode_request(lm, "hi") == ids(lm, "[user]hi[gen]")
    assert encode_request(lm, "hi", chat=True) == ids(lm, "[user]hi[gen]")
    assert encode_request(lm, "hi", chat=False) == lm.tokenizer.encode("hi")  # --raw
    assert encode_request(lm, "hi", system="Be brief.") == ids(lm, "[system]Be brief.[user]hi[gen]")
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert encode_request(lm, "c", messages=turns) == ids(lm, "[user]a[assistant]b[user]c[gen]")
    assert encode_request(lm, None, messages=turns[:1]) == ids(lm, "[user]a[gen]")


def test_a_model_without_a_template_gets_raw_text_silently() -> None:
    lm = MockLM()
    assert encode_request(lm, "hi") == encode_prompt(lm, "hi") == lm.tokenizer.encode("hi")


def test_system_or_messages_without_a_template_are_clear_errors() -> None:
    lm = MockLM()
    with pytest.raises(ConfigError, match="no chat template: --system / --messages"):
        encode_request(lm, "hi", system="s")
    with pytest.raises(ConfigError, match="no chat template"):
        encode_request(lm, "hi", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(ConfigError, match="--chat needs"):
        encode_request(lm, "hi", chat=True)
    with pytest.raises(ConfigError, match="drop --raw"):
        encode_request(chat_mock(), "hi", system="s", chat=False)


@pytest.mark.parametrize(
    "bad,match",
    [
        ({}, "non-empty JSON list"),
        ([], "non-empty JSON list"),
        (["hi"], r"\[0\] is not an object"),
        ([{"role": "user"}], r"\[0\] has no content"),
        ([{"content": "x"}], r"\[0\] has no role"),
        ([{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}], r"\[1\].*'bot'"),
        ([{"role": "user", "content": 3}], "must be a string, got int"),
    ],
)
def test_bad_messages_name_the_entry(bad: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_messages(bad)


def test_messages_file_errors_and_duplicate_system(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_messages(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_messages(tmp_path / "bad.json")
    (tmp_path / "ok.json").write_text(json.dumps([{"role": "system", "content": "s"}]))
    msgs = read_messages(tmp_path / "ok.json")
    with pytest.raises(ConfigError, match="system prompt once"):
        build_messages("hi", msgs, "other")
    with pytest.raises(EmptyPromptError):
        build_messages("  ", msgs, None)


def test_api_pair_chat_by_default_and_raw() -> None:
    target = chat_mock()
    pair = Pair(target, None)
    c = pair.generate("hi", system="s", max_new_tokens=4, stop_on_eos=False)
    assert c.result.prompt_ids == ids(target, "[system]s[user]hi[gen]")
    raw = pair.generate("hi", raw=True, max_new_tokens=4, stop_on_eos=False)
    assert raw.result.prompt_ids == target.tokenizer.encode("hi")
    turns = [{"role": "user", "content": "q"}]
    assert pair.encode(messages=turns) == ids(target, "[user]q[gen]")
    with pytest.raises(ConfigError):
        pair.generate([5, 6], system="s")
    with pytest.raises(ConfigError):
        pair.encode("hi", raw=True, chat=True)


CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny transformers model whose tokenizer has a chat template."""
    from transformers import AutoTokenizer

    path = make_tiny_hf(tmp_path_factory.mktemp("chat") / "m", seed=4, arch="qwen2", layers=1)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return path


def _json_run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["generate", *argv, "--draft", "none", "-n", "3", "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_cli_chat_by_default_raw_system_and_messages(
    chat_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = ["-m", str(chat_dir), "--target-backend", "hf", "--device", "cpu"]
    model += ["--dtype", "float32"]
    chat = _json_run(capsys, "-p", "hi", *model)
    raw = _json_run(capsys, "-p", "hi", "--raw", *model)
    explicit = _json_run(capsys, "-p", "hi", "--chat", *model)
    # "<user>hi|<assistant>" with the character tokenizer: one id per character
    assert chat["prompt_tokens"] == explicit["prompt_tokens"] == len("<user>hi|<assistant>")
    assert raw["prompt_tokens"] == len("hi")  # this tokenizer adds no BOS
    sys_run = _json_run(capsys, "-p", "hi", "--system", "S", *model)
    assert sys_run["prompt_tokens"] == len("<system>S|<user>hi|<assistant>")
    f = tmp_path / "m.json"
    f.write_text(
        json.dumps([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    )
    multi = _json_run(capsys, "--messages", str(f), "-p", "c", *model)
    assert multi["prompt_tokens"] == len("<user>a|<assistant>b|<user>c|<assistant>")


MOCK = ["--draft", "none", "--target", "mock:target", "--target-backend", "mock"]


@pytest.mark.parametrize(
    "argv,match",
    [
        (["x", "--system", "s"], "no chat template"),
        (["x", "--chat"], "--chat needs"),
        (["x", "--chat", "--raw"], "not allowed with"),
        ([], "give a prompt"),
        (["x", "--raw", "--system", "s"], "drop --raw"),
    ],
)
def test_cli_chat_errors_are_one_line(
    argv: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = main(["generate", *argv, *MOCK])
    except SystemExit as e:  # argparse's own errors
        rc = int(e.code or 0)
    err = capsys.readouterr().err
    assert rc == 2 and match in err and "Traceback" not in err
