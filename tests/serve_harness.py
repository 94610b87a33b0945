"""A real ``specdec serve`` app on loopback (uvicorn in a thread) over mock models."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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
    import uvicorn

    from specdec.serve import ServeConfig, ServeSettings, create_app

    shutdown_timeout = config.pop("shutdown_timeout", 5.0)
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
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=shutdown_timeout)
    )
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
