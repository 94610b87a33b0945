"""A real ``specdec serve`` app on loopback (uvicorn in a thread) over mock models."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from specdec.api import Pair
from specdec.models.mock import MockLM, MockSpec, MockTokenizer


class ChatTokenizer(MockTokenizer):
    """The mock tokenizer plus a chat template: ``<|role|>content`` turns, then the
    assistant header."""

    def apply_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"
        return self.encode(text, add_special_tokens=True)


class ServeMock(MockLM):
    """A mock model with a chat template and, optionally, a delay per forward pass (so that
    generations last long enough to queue, cancel and disconnect)."""

    def __init__(self, spec: MockSpec, delay: float = 0.0) -> None:
        super().__init__(spec)
        self._tokenizer = ChatTokenizer(spec.vocab_size)
        self.delay = delay

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return super().extend(tokens, last_only=last_only)


def mock_serve_pair(
    *, draft: str = "identical", vocab: int = 64, delay: float = 0.0, n_ctx: int = 512
) -> Pair:
    """A target and a draft ('identical': every draft accepted; 'close': some rejected;
    'none': plain decoding) with EOS disabled so lengths are predictable."""
    target_spec = MockSpec(vocab_size=vocab, n_ctx=n_ctx, eos_token_id=vocab + 1)
    target = ServeMock(target_spec, delay)
    if draft == "none":
        return Pair(target, None)
    noise = {"identical": 0.0, "close": 0.7}[draft]
    dspec = MockSpec(
        vocab_size=vocab, n_ctx=n_ctx, eos_token_id=vocab + 1, noise_seed=1000, noise=noise
    )
    return Pair(target, ServeMock(dspec, delay))


def start_server(pair: Pair, **config: Any) -> tuple[str, Callable[[], None]]:
    """Serve ``pair`` on a free loopback port in a thread: (base URL, stop). ``config``:
    ServeConfig and ServeSettings fields, and ``shutdown_timeout`` (uvicorn's graceful wait)."""
    from specdec.serve import ServeConfig, ServeSettings, create_app
    from specdec.serve.server import make_server

    shutdown_timeout = config.pop("shutdown_timeout", 5.0)
    limits = config.pop("limits", None)
    settings_keys = {"model_name", "k", "adaptive", "default_max_tokens"}
    settings = ServeSettings(
        **{"model_name": "mock", **{k: v for k, v in config.items() if k in settings_keys}}
    )
    rest = {k: v for k, v in config.items() if k not in settings_keys}
    app = create_app(pair, ServeConfig(settings=settings, **rest))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    extra = {"limits": limits} if limits is not None else {}
    server = make_server(app, app.state.specdec.engine, shutdown_timeout=shutdown_timeout, **extra)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("the test server did not stop")

    return f"http://127.0.0.1:{port}", stop


@contextmanager
def running_server(pair: Pair, **config: Any) -> Iterator[str]:
    """``start_server`` as a context manager yielding the base URL."""
    base, stop = start_server(pair, **config)
    try:
        yield base
    finally:
        stop()


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_pair(template: str = CHATML) -> Pair:
    """A mock target whose tokenizer reads <|im_start|> / <|im_end|> as special ids 2 and 1
    when it parses special tokens (as llama.cpp's and transformers' do)."""
    import re

    class ChatMLTokenizer(MockTokenizer):
        SPECIAL: ClassVar[dict[str, int]] = {"<|im_start|>": 2, "<|im_end|>": 1}
        chat_template = template

        def chat_variables(self) -> dict[str, Any]:
            return {"add_generation_prompt": True}

        def special_texts(self) -> frozenset[str]:
            return frozenset(self.SPECIAL)

        def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
            return [self.BOS] * add_special_tokens + self.encode_piece(text, special=True)

        def encode_piece(self, text: str, *, special: bool) -> list[int]:
            if not special:
                return MockTokenizer.encode(self, text, add_special_tokens=False)
            ids: list[int] = []
            for part in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
                special_id = self.SPECIAL.get(part)
                if special_id is not None:
                    ids.append(special_id)
                else:
                    ids += self.encode_piece(part, special=False)
            return ids

        def apply_chat(
            self, messages: list[dict[str, str]], *, parse_special: bool = False
        ) -> list[int]:
            from specdec.templates import encode_chat

            return encode_chat(self, messages, parse_special=parse_special)

    class ChatMLMock(MockLM):
        def __init__(self, spec: MockSpec) -> None:
            super().__init__(spec)
            self._tokenizer = ChatMLTokenizer(spec.vocab_size)

    return Pair(ChatMLMock(MockSpec(vocab_size=64, n_ctx=512, eos_token_id=65)), None)
