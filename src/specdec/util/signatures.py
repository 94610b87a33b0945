"""Functions made from other functions with the same parameters by construction (what
``help()`` and IDEs show): the whole-result form of a streaming function."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R", covariant=True)


class Runs(Protocol[_R]):
    """A stream that can be drained to its result."""

    def run(self) -> _R: ...


def drained(stream: Callable[_P, Runs[_R]], returns: str, of: str) -> Callable[_P, _R]:
    """``stream``'s parameters, run to the end: ``stream(...).run()``, documented as returning
    ``returns`` and taking the arguments of ``of`` (the stream's public name)."""

    def run_to_end(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return stream(*args, **kwargs).run()

    run_to_end.__doc__ = (
        f"Generate to the end and return the ``{returns}``; the arguments are those of "
        f"``{of}``:\n\n" + (stream.__doc__ or "")
    )
    run_to_end.__signature__ = inspect.signature(stream).replace(  # type: ignore[attr-defined]
        return_annotation=returns
    )
    return run_to_end
